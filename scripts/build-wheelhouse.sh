#!/usr/bin/env bash
# make wheelhouse: download every wheel of a hashed lock once, on the controller, into a local wheelhouse that the
# test nodes (and the demo node) mount read-only and install from with no index (vllm_env_offline: true).
# Usage: scripts/build-wheelhouse.sh [LOCK] [OUT]
#   LOCK  default roles/vllm_env/files/requirements/vllm-0.32.0-cpu.txt
#   OUT   default .cache/wheelhouse/<LOCK's name without .txt>
#   WHEELHOUSE_FIND_LINKS  where wheels that are not on the index come from (default /opt/wheels: torch +cpu);
#                          a directory or URL pip accepts as --find-links.
#   WHEELHOUSE_PLATFORM    the nodes' platform in uv's spelling (default x86_64-manylinux_2_36: Debian 12, glibc 2.36).
#                          Not the lock header's x86_64-manylinux_2_28: uv resolves for that, but some pins only have
#                          newer wheels (llguidance 1.7.6: manylinux_2_31), which the nodes install.
# The target Python is read from the lock's header (the `uv pip compile` command). pip checks every wheel against
# the lock's sha256 (--require-hashes).
# OUT/.lock-sha256 records the lock (and uv version) it was built from, written last: when it matches, nothing is
# downloaded; when the lock changed, wheels still in the lock are kept, the others removed, the rest downloaded.
# The wheelhouse also holds the uv wheel the vllm_env role installs on the node (vllm_env_uv_version).
set -euo pipefail
cd "$(dirname "$0")/.."

lock=${1:-roles/vllm_env/files/requirements/vllm-0.32.0-cpu.txt}
out=${2:-.cache/wheelhouse/$(basename "$lock" .txt)}
find_links=${WHEELHOUSE_FIND_LINKS:-/opt/wheels}
python=${PYTHON:-python3}
t0=$SECONDS

die() { echo "build-wheelhouse: $*" >&2; exit 1; }
[ -f "$lock" ] || die "no lock file $lock"

# Target interpreter, from the header `uv pip compile ... --python-version 3.11 ...`.
pyver=$(grep -oE -- '--python-version[ =][0-9]+\.[0-9]+' "$lock" | head -n1 | grep -oE '[0-9]+\.[0-9]+$') ||
  die "$lock has no --python-version in its header; regenerate it as roles/vllm_env/README.md shows"
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

stamp="$(sha256sum "$lock" | cut -d' ' -f1) uv==$uv_version"
mkdir -p "$out"
exec 9>"$out.build-lock"
flock 9  # two builds of one wheelhouse (make demo beside make molecule) take turns

if [ "$(cat "$out/.lock-sha256" 2>/dev/null)" = "$stamp" ]; then
  echo "wheelhouse $out is up to date with $lock ($(du -sh "$out" | cut -f1)); nothing downloaded"
  exit 0
fi
rm -f "$out/.lock-sha256"

# --no-cache-dir: the wheelhouse is the cache; pip's own would hold a second copy of the same 2.4 GB.
target=(--only-binary=:all: --python-version "$pyver" --implementation cp "${platforms[@]}"
        --dest "$out" --progress-bar off --disable-pip-version-check --no-cache-dir)
echo "wheelhouse $out: wheels of $lock for CPython $pyver on $pip_platform (extra find-links: $find_links)"
"$python" -m pip download "${target[@]}" --no-deps --require-hashes --find-links "$find_links" -r "$lock" ||
  die "pip download failed; wheels missing from the index must be in WHEELHOUSE_FIND_LINKS ($find_links)"
"$python" -m pip download "${target[@]}" --no-deps "uv==$uv_version"

# Drop wheels an older lock needed and this one does not (anything whose sha256 the lock does not list, except uv).
declare -A wanted=()
while read -r h; do wanted[$h]=1; done < <(grep -oE 'sha256:[0-9a-f]{64}' "$lock" | cut -d: -f2)
removed=0
for f in "$out"/*; do
  case ${f##*/} in uv-"$uv_version"-*.whl) continue ;; esac
  h=$(sha256sum "$f" | cut -d' ' -f1)
  if [ -z "${wanted[$h]:-}" ]; then rm -f "$f"; removed=$((removed + 1)); fi
done

printf '%s\n' "$stamp" > "$out/.lock-sha256"
echo "wheelhouse $out: $(find "$out" -name '*.whl' | wc -l) wheels, $(du -sh "$out" | cut -f1)," \
  "$removed stale removed, built in $((SECONDS - t0)) s"
