# cubevec_set_warnings(target): the project's warning set, -Werror when CUBEVEC_WERROR is on.
function(cubevec_set_warnings target)
  target_compile_options(${target} PRIVATE
    -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    -Wnon-virtual-dtor -Wold-style-cast -Woverloaded-virtual -Wnull-dereference -Wformat=2)
  # GCC 12 reports false -Wrestrict hits inside libstdc++ for `"text" + std::string` (GCC bug 105329).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    target_compile_options(${target} PRIVATE -Wno-restrict)
  endif()
  # Sanitizer instrumentation changes GCC's inlining so that its path-based -Wnull-dereference
  # reports impossible paths inside libstdc++ (seen: CLI11's split under -fsanitize=thread). The
  # uninstrumented build, which every session runs first, keeps the warning.
  if(CUBEVEC_SANITIZE AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-null-dereference)
  endif()
  # GCC warns about a type that uses the anonymous namespace in an #included file, which is right
  # for a header; a unity build #includes the .cpp files themselves, so every such type warns.
  if(CMAKE_UNITY_BUILD AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-subobject-linkage)
  endif()
  if(CUBEVEC_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
