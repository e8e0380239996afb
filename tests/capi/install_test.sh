#!/bin/bash
# `cmake --install` into a scratch prefix gives P/include/cubevec.h, P/lib/libcubevec.so,
# P/lib/pkgconfig/cubevec.pc and P/bin/cubevec; examples/embed.c then compiles against the
# installed copy through pkg-config alone and renders a picture.
#   install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 source=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" > /dev/null
for f in include/cubevec.h lib/libcubevec.so lib/pkgconfig/cubevec.pc bin/cubevec; do
  [ -e "$prefix/$f" ] || { echo "install_test: $prefix/$f is missing after cmake --install" >&2; exit 1; }
done
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -std=c11 -Wall -Werror "$source/examples/embed.c" $(pkg-config --cflags --libs cubevec) -o "$prefix/embed"
LD_LIBRARY_PATH="$prefix/lib" "$prefix/embed" "$source/assets/tinyflux" "$prefix/out.ppm" "a small green square on a white background"
# A binary PPM of 64 x 64 RGB: its header and 12288 bytes.
[ "$(head -c 2 "$prefix/out.ppm")" = "P6" ] || { echo "install_test: out.ppm is not a PPM" >&2; exit 1; }
size=$(stat -c %s "$prefix/out.ppm")
[ "$size" -eq $((13 + 64 * 64 * 3)) ] || { echo "install_test: out.ppm has $size bytes, expected $((13 + 64 * 64 * 3))" >&2; exit 1; }
echo "install_test: installed, built examples/embed.c with pkg-config, rendered $size bytes"
