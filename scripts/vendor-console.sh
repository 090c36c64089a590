#!/usr/bin/env bash
# Vendors the web console's front-end libraries (src/loglake/node/console/static/vendor/).
#
# The console ships every asset inside the package (no CDN at run time), so the minified ES
# modules are committed; this script is how they got there and how to update them. It fetches
# each pinned tarball from the npm registry with `npm pack`, checks it against the sha512
# pinned below (the registry's `dist.integrity`), and copies the browser builds and licences.
# To update: change a version, run `npm view <pkg>@<version> dist.integrity`, pin the new
# hash, run this script, and commit static/vendor/ with the console's tests passing.
set -euo pipefail

# package  version  sha512 integrity (npm view <pkg>@<version> dist.integrity)
PINS=(
  "preact 11.2.0 sha512-/HfHI/7N84e6GrWBJ3J280z3mLaRJiDcSvj/A+y/4AbLnND/1UlGHe1sR6oYuTGwId0nP7dqDU9OnLxMPZ7xBg=="
  "htm 3.1.1 sha512-983Vyg8NwUE7JkZ6NmOqpCZ+sh1bKv2iYTlUkzlWmA5JD2acKoxd4KVxbMmxX/85mtfdnDmTFoNKcg5DGAvxNQ=="
)
# package → files copied from its tarball's package/ folder (name in vendor/ = basename)
declare -A FILES=(
  [preact]="dist/preact.mjs hooks/dist/hooks.mjs LICENSE"
  [htm]="dist/htm.mjs LICENSE"
)

command -v npm >/dev/null || { echo "error: npm is needed (Debian: apt-get install npm)" >&2; exit 1; }
here="$(cd "$(dirname "$0")/.." && pwd)"
dest="$here/src/loglake/node/console/static/vendor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$dest"
for pin in "${PINS[@]}"; do
  read -r pkg version integrity <<<"$pin"
  (cd "$work" && npm pack --silent "$pkg@$version" >/dev/null)
  tgz="$work/$pkg-$version.tgz"
  got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
  if [ "$got" != "$integrity" ]; then
    echo "error: $pkg@$version tarball is $got, pinned $integrity" >&2
    exit 1
  fi
  mkdir -p "$work/$pkg"
  tar xzf "$tgz" -C "$work/$pkg"
  for f in ${FILES[$pkg]}; do
    name="$(basename "$f")"
    [ "$name" = LICENSE ] && name="LICENSE-$pkg"
    cp "$work/$pkg/package/$f" "$dest/$name"
  done
  echo "vendored $pkg@$version"
done
# The versions the page loads, for docs/console.md and a reader of static/vendor/.
printf '%s\n' "${PINS[@]}" | awk '{print $1 "@" $2 " " $3}' >"$dest/VERSIONS"
