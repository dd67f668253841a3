#!/usr/bin/env bash
# Role README variable tables from meta/argument_specs.yml, written by aar-doc (settings: .aar_doc.yml) between the
# <!-- BEGIN_ANSIBLE_DOCS --> / <!-- END_ANSIBLE_DOCS --> lines of roles/<role>/README.md.
#   scripts/role-docs.sh          rewrite the READMEs whose tables are out of date (make docs)
#   scripts/role-docs.sh --check  change nothing; fail with the diff when a README is out of date (make lint)
set -euo pipefail
cd "$(dirname "$0")/.."
check=false
[ "${1:-}" = --check ] && check=true
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Every role with argument specs, rendered into a copy of its README (in parallel: ~0.5 s of start-up each).
roles=()
for spec in roles/*/meta/argument_specs.yml; do
  role=${spec#roles/}
  role=${role%%/*}
  readme=roles/$role/README.md
  if ! grep -qx '<!-- BEGIN_ANSIBLE_DOCS -->' "$readme" 2>/dev/null || ! grep -qx '<!-- END_ANSIBLE_DOCS -->' "$readme"; then
    echo "role-docs: $readme needs a line <!-- BEGIN_ANSIBLE_DOCS --> and a line <!-- END_ANSIBLE_DOCS --> where" \
      "its variable table goes (the role has meta/argument_specs.yml); add them, then run: make docs" >&2
    exit 1
  fi
  cp "$readme" "$tmp/$role.md"
  aar-doc --config-file .aar_doc.yml --output-file "$tmp/$role.md" "roles/$role" markdown >"$tmp/$role.log" 2>&1 &
  roles+=("$role:$!")
done

status=0
for entry in "${roles[@]}"; do
  role=${entry%%:*}
  readme=roles/$role/README.md
  if ! wait "${entry#*:}"; then
    echo "role-docs: aar-doc failed on roles/$role:" >&2
    cat "$tmp/$role.log" >&2
    status=1
  elif ! cmp -s "$readme" "$tmp/$role.md"; then
    if $check; then
      echo "role-docs: $readme differs from roles/$role/meta/argument_specs.yml; run: make docs" >&2
      diff -u "$readme" "$tmp/$role.md" >&2 || true
      status=1
    else
      cp "$tmp/$role.md" "$readme"
      echo "role-docs: rewrote $readme"
    fi
  fi
done
exit "$status"
