#!/usr/bin/env bash
# Spark 4 needs Java 17 or newer. Say so plainly instead of letting the JVM fail later.
set -u
java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
if ! command -v "$java_bin" >/dev/null 2>&1; then
  echo "error: Java not found. loglake's Spark pipeline needs Java 17+ (Debian: apt-get install openjdk-17-jre-headless, or set JAVA_HOME)." >&2
  exit 1
fi
ver=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
major=${ver%%.*}
[ "$major" = "1" ] && major=$(echo "$ver" | cut -d. -f2)
if [ -z "$major" ] || [ "$major" -lt 17 ] 2>/dev/null; then
  echo "error: Java $ver found at $(command -v "$java_bin"); Spark needs Java 17+ (set JAVA_HOME to a newer JDK)." >&2
  exit 1
fi
