// FileLock: it excludes another holder of the lock file (another process's descriptor: flock
// conflicts between open file descriptions, so a second descriptor in this process stands in for
// one), is reentrant within a thread, makes threads take turns, and never hangs or follows a planted
// symlink or FIFO: a lock it cannot have within its wait leaves the caller unlocked.
#include "base/file_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/temp_dir.h"

namespace cubevec {
namespace file_lock_test {  // named after the file: unity batches never mix two files' helpers

using namespace std::chrono_literals;
using testing::TempDir;

// Whether another open file description can take the lock now.
bool free_for_another_holder(const std::string& lock_path) {
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;  // no lock file: nothing holds it
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

TEST(FileLock, ExcludesAnotherHolderAndIsReentrant) {
  TempDir dir;
  const std::string target = (dir.path / "tuning.json").string();
  const std::string lock_path = FileLock::lock_path(target);
  {
    FileLock lock(target, 0ms);
    EXPECT_TRUE(lock.held());
    EXPECT_FALSE(free_for_another_holder(lock_path));
    {
      FileLock again(target, 0ms);  // would time out at once if it waited for its own holder
      EXPECT_TRUE(again.held());
    }
    EXPECT_FALSE(free_for_another_holder(lock_path)) << "the inner release kept the outer lock";
  }
  EXPECT_TRUE(free_for_another_holder(lock_path));
  EXPECT_FALSE(std::filesystem::exists(target)) << "the target itself is never created";
}

TEST(FileLock, AHolderThatDoesNotLetGoIsGoneAroundAfterTheWait) {
  TempDir dir;
  const std::string target = (dir.path / "tuning.json").string();
  const int other = ::open(FileLock::lock_path(target).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(other, 0);
  ASSERT_EQ(::flock(other, LOCK_EX), 0);
  const auto start = std::chrono::steady_clock::now();
  {
    FileLock lock(target, 100ms);
    EXPECT_FALSE(lock.held());
    EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  }
  // A holder that outlasted one wait gets no second one from this process: one try.
  {
    const auto again = std::chrono::steady_clock::now();
    FileLock lock(target, 10s);
    EXPECT_FALSE(lock.held());
    EXPECT_LT(std::chrono::steady_clock::now() - again, 5s);
  }
  ::flock(other, LOCK_UN);
  {
    FileLock lock(target, 0ms);  // let go: taken at the first try
    EXPECT_TRUE(lock.held());
  }
  ::close(other);
}

TEST(FileLock, AHolderThatLetsGoWithinTheWaitHandsItOver) {
  TempDir dir;
  const std::string target = (dir.path / "tuning.json").string();
  const int other = ::open(FileLock::lock_path(target).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(other, 0);
  ASSERT_EQ(::flock(other, LOCK_EX), 0);
  std::thread release([&] {
    std::this_thread::sleep_for(50ms);
    ::flock(other, LOCK_UN);
  });
  {
    FileLock lock(target, 10s);
    EXPECT_TRUE(lock.held());
    EXPECT_FALSE(free_for_another_holder(FileLock::lock_path(target)));
  }
  release.join();
  ::close(other);
}

// A lock file another user created (read-only to this one) still works: flock needs no write access.
TEST(FileLock, AReadOnlyLockFileIsStillShared) {
  TempDir dir;
  const std::string target = (dir.path / "tuning.json").string();
  const std::string lock_path = FileLock::lock_path(target);
  ::close(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0444));
  ASSERT_EQ(::chmod(lock_path.c_str(), 0444), 0);
  FileLock lock(target, 0ms);
  EXPECT_TRUE(lock.held());
  EXPECT_FALSE(free_for_another_holder(lock_path));
}

TEST(FileLock, ThreadsTakeTurns) {
  TempDir dir;
  const std::string target = (dir.path / "tuning.json").string();
  std::atomic<int> inside{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        FileLock lock(target, 10s);
        const int now = ++inside;
        most = std::max(most.load(), now);
        std::this_thread::sleep_for(100us);
        --inside;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(most.load(), 1);
}

TEST(FileLock, APlantedSymlinkOrFifoIsNotUsed) {
  TempDir dir;
  const std::string target = (dir.path / "tuning.json").string();
  const std::string victim = (dir.path / "victim").string();
  std::filesystem::create_symlink(victim, FileLock::lock_path(target));
  {
    FileLock lock(target, 0ms);
    EXPECT_FALSE(lock.held());
  }
  EXPECT_FALSE(std::filesystem::exists(victim)) << "the symlink was not followed";
  std::filesystem::remove(FileLock::lock_path(target));
  ASSERT_EQ(::mkfifo(FileLock::lock_path(target).c_str(), 0600), 0);
  {
    FileLock lock(target, 10s);  // no writer ever comes: it must not wait for one
    EXPECT_FALSE(lock.held());
  }
  std::filesystem::remove(FileLock::lock_path(target));
  std::filesystem::create_directory(FileLock::lock_path(target));
  FileLock lock(target, 10s);
  EXPECT_FALSE(lock.held());
}

TEST(FileLock, AFolderThatCannotHoldTheLockFileLeavesItUnlocked) {
  TempDir dir;
  {
    FileLock lock((dir.path / "missing" / "tuning.json").string(), 10s);
    EXPECT_FALSE(lock.held());
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path / "missing")) << "FileLock creates no folder";
  if (::geteuid() == 0) return;  // root writes any folder
  const std::filesystem::path locked_out = dir.path / "read-only";
  std::filesystem::create_directories(locked_out);
  std::filesystem::permissions(locked_out, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  {
    FileLock lock((locked_out / "tuning.json").string(), 10s);
    EXPECT_FALSE(lock.held());
  }
  std::filesystem::permissions(locked_out, std::filesystem::perms::owner_all);
}

}  // namespace file_lock_test
}  // namespace cubevec
