#!/usr/bin/env bash
# Certificates for a Temporal cluster with mutual TLS, as deploy/compose and deploy/kubernetes
# expect them: a CA of the cluster's own, Temporal's server certificate, and client
# certificates for llmgw's processes (llmgw) and for the web UI and Temporal's setup (admin).
#
#   deploy/make-certs.sh DIR [NAME ...]
#
# NAMEs are extra DNS names or IP addresses for Temporal's certificate, besides `temporal` and
# `temporal.llmgw.svc`. llmgw's processes check the name `temporal`
# (LLMGW_TEMPORAL_TLS_SERVER_NAME), so nodes can dial the control host by its IP without
# listing it. Needs openssl. tests/integration/test_temporal_tls.py runs this script and connects
# with what it makes.
#
# DIR gets ca.pem, temporal.{pem,key}, llmgw.{pem,key}, admin.{pem,key}; the CA's own key goes
# to DIR/private/ca.key, which no service needs: keep it off the servers once you are done.
# Key files are mode 0640, group 10001 (the llmgw image's group) when run as root, else 0600.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 DIR [NAME ...]" >&2
    exit 2
fi
dir=$1
shift
days=825
mkdir -p "$dir"
mkdir -p -m 700 "$dir/private"
umask 077
cd "$dir"

names="DNS:temporal,DNS:temporal.llmgw.svc"
for name in "$@"; do
    if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then
        names="$names,IP:$name"
    else
        names="$names,DNS:$name"
    fi
done

if [ ! -e ca.pem ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days "$days" \
        -subj "/CN=llmgw cluster CA" -keyout private/ca.key -out ca.pem \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

issue() {  # NAME EXTENSIONS
    local extensions
    extensions=$(mktemp)
    printf '%b' "$2" >"$extensions"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
        -keyout "$1.key" -out "$1.csr" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey private/ca.key \
        -CAserial private/ca.srl -CAcreateserial \
        -days "$days" -out "$1.pem" -extfile "$extensions" 2>/dev/null
    rm -f "$1.csr" "$extensions"
}

# Temporal's own services also dial each other with this certificate: server and client use.
issue temporal "basicConstraints=critical,CA:FALSE\nsubjectAltName=$names\nextendedKeyUsage=serverAuth,clientAuth\n"
issue llmgw "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n"
issue admin "basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n"

chmod 644 ./*.pem
if [ "$(id -u)" = 0 ]; then
    chgrp 10001 ./*.key
    chmod 640 ./*.key
else
    chmod 600 ./*.key
    echo "not root: keys are 0600 and yours; for containers, chgrp 10001 and chmod 640 them" >&2
fi
echo "made ca.pem, temporal, llmgw and admin certificates in $dir (Temporal's names: $names)"
