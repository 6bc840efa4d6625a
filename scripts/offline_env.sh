# Source this to build on a machine without a package registry: it unpacks the Debian packages in
# $DSI_DEPS_DIR/debs (fetched elsewhere with `apt-get download`, see README) into
# $DSI_DEPS_DIR/root once, and points CMake, the compiler and the loader at them.
#   DSI_DEPS_DIR=/path/to/deps source scripts/offline_env.sh
: "${DSI_DEPS_DIR:?set DSI_DEPS_DIR to a folder holding debs/}"
if [ ! -d "$DSI_DEPS_DIR/root" ]; then
  mkdir -p "$DSI_DEPS_DIR/root"
  for deb in "$DSI_DEPS_DIR"/debs/*.deb; do dpkg-deb -x "$deb" "$DSI_DEPS_DIR/root"; done
fi
_dsi_usr="$DSI_DEPS_DIR/root/usr"
export CMAKE_PREFIX_PATH="$_dsi_usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$_dsi_usr/lib/x86_64-linux-gnu:$_dsi_usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$LD_LIBRARY_PATH"
unset _dsi_usr
