#!/usr/bin/env bash
# Test certificates for rmmd's peering (docs/operations.md, "Across nodes"),
# made with the openssl CLI (OpenSSL 3.0 on Debian 12 and Ubuntu 24.04):
#
#   ./scripts/make-test-certs.sh DIR
#
# writes into DIR (created if missing):
#   ca.pem, ca.key              the CA both test nodes trust
#   nodeA.pem, nodeA.key        CN=rmmd-nodeA, signed by ca
#   nodeB.pem, nodeB.key        CN=rmmd-nodeB, signed by ca
#   nodeC.pem, nodeC.key        CN=rmmd-nodeC, signed by ca (a node no grant names)
#   nodeA-next.pem, .key        CN=rmmd-nodeA again, signed by ca, its own key
#                               (nodeA's certificate after a rotation)
#   other-ca.pem, other-ca.key  a CA nobody trusts
#   stranger.pem, stranger.key  CN=rmmd-stranger, signed by other-ca
#   nodeA-other-ca.pem, .key    CN=rmmd-nodeA, signed by other-ca
#   nodeB-other-ca.pem, .key    CN=rmmd-nodeB, signed by other-ca (the nodes'
#                               names from a CA their peers do not trust,
#                               or the CA they rotate to)
#   expired.pem, expired.key    CN=rmmd-expired, signed by ca, valid only in 2020
# Every node certificate names DNS:localhost and IP:127.0.0.1 and may serve
# and dial (extendedKeyUsage serverAuth, clientAuth). Keys are EC P-256,
# unencrypted, mode 0600. For tests only: never use these keys for real nodes.
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 DIR" >&2
  exit 2
fi
out=$1
command -v openssl >/dev/null || { echo "$0: needs the openssl command" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# A CA: NAME (file stem) and CN.
make_ca() {
  key "$out/$1.key"
  openssl req -x509 -new -key "$out/$1.key" -sha256 -days 3650 -subj "/O=rmmd test/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" \
    -out "$out/$1.pem"
}

cat >"$work/node.ext" <<'EOF'
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF

# A node certificate: STEM, CN, CA stem. Its subject is CN only, so that
# gRPC's x509_subject (RFC 2253) reads "CN=<CN>" and grants can name it so.
make_node() {
  key "$out/$1.key"
  openssl req -new -key "$out/$1.key" -subj "/CN=$2" -out "$work/$1.csr"
  openssl x509 -req -in "$work/$1.csr" -CA "$out/$3.pem" -CAkey "$out/$3.key" \
    -CAcreateserial -CAserial "$work/$3.srl" -days 825 -sha256 \
    -extfile "$work/node.ext" -out "$out/$1.pem" 2>/dev/null
}

make_ca ca "rmmd test CA"
make_ca other-ca "rmmd other test CA"
make_node nodeA rmmd-nodeA ca
make_node nodeB rmmd-nodeB ca
make_node nodeC rmmd-nodeC ca
make_node nodeA-next rmmd-nodeA ca
make_node stranger rmmd-stranger other-ca
make_node nodeA-other-ca rmmd-nodeA other-ca
make_node nodeB-other-ca rmmd-nodeB other-ca

# expired: `openssl x509 -req` takes no start date, `openssl ca` does: a
# throwaway CA database in the temp dir.
mkdir -p "$work/ca/newcerts"
: >"$work/ca/index.txt"
echo 1000 >"$work/ca/serial"
cat >"$work/ca.cnf" <<EOF
[ ca ]
default_ca = test_ca
[ test_ca ]
dir           = $work/ca
database      = \$dir/index.txt
new_certs_dir = \$dir/newcerts
serial        = \$dir/serial
certificate   = $out/ca.pem
private_key   = $out/ca.key
default_md    = sha256
policy        = anything
unique_subject = no
copy_extensions = none
[ anything ]
commonName = supplied
[ node ]
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
EOF
key "$out/expired.key"
openssl req -new -key "$out/expired.key" -subj "/CN=rmmd-expired" -out "$work/expired.csr"
openssl ca -batch -config "$work/ca.cnf" -extensions node -notext \
  -startdate 20200101000000Z -enddate 20200201000000Z \
  -in "$work/expired.csr" -out "$out/expired.pem" 2>/dev/null

chmod 0644 "$out"/*.pem
chmod 0600 "$out"/*.key
echo "test certificates in $out: ca, nodeA, nodeA-next, nodeB, nodeC, other-ca, stranger, nodeA-other-ca, nodeB-other-ca, expired"
