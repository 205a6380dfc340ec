#!/bin/sh
# deploy/maas/upload.sh PROFILE DOMAIN
# Fills the BMC domain (the controller's `domain`, virtmetal-config) into
# virtmetal-bmc-config.py and uploads it to MaaS as the commissioning script
# 50-virtmetal-bmc-config, replacing the one uploaded before if any. PROFILE
# is a logged-in maas CLI profile (maas login PROFILE URL KEY). The script's
# embedded metadata tags it bmc-config and enlisting: enlisting is what makes
# it run at enlistment under MaaS's default enlist_commissioning=true
# (README.md, step 2).
set -eu
if [ $# -ne 2 ]; then
  echo "usage: $0 PROFILE DOMAIN" >&2
  exit 64
fi
profile=$1
domain=$2
case $domain in
  *[!a-z0-9.-]* | "" | .* | *. )
    echo "$0: $domain is not a DNS name (lower case letters, digits, - and .)" >&2
    exit 64 ;;
esac
name=50-virtmetal-bmc-config
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
sed "s/@VIRTMETAL_BMC_DOMAIN@/$domain/" "$(dirname "$0")/virtmetal-bmc-config.py" > "$dir/$name"
if maas "$profile" node-script read "$name" > /dev/null 2>&1; then
  maas "$profile" node-script update "$name" "script@=$dir/$name"
else
  maas "$profile" node-scripts create "name=$name" "script@=$dir/$name"
fi
