#!/usr/bin/env bash
# Makes the certificates of the TLS tests and benchmarks with the openssl
# command-line tool, into DIR (EC P-256 keys, PEM):
#   ca.pem                          the test CA
#   server.pem / server.key         signed by it, for 127.0.0.1, ::1 and localhost
#   client.pem / client.key         signed by it (mutual TLS)
#   expired.pem / expired.key       signed by it, valid 2020-01-01 .. 2020-01-02 only
#   other_ca.pem                    another CA
#   wrong_ca.pem / wrong_ca.key     a server certificate signed by the other CA
# Usage: scripts/make_test_certs.sh DIR
set -euo pipefail
dir=${1:?usage: make_test_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }
ca() { # name subject
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -sha256 -days 3650 -subj "/CN=$2" -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}
ca ca "corodist test CA"
ca other_ca "corodist other CA"
cat > leaf.ext <<'EXT'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost
EXT
leaf() { # name subject ca
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days 3650 -sha256 \
    -extfile leaf.ext -out "$1.pem" 2>/dev/null
}
leaf server "corodist test server" ca
leaf client "corodist test client" ca
leaf wrong_ca "corodist server of the other CA" other_ca
# An expired certificate: `openssl ca` takes explicit start and end dates.
mkdir -p ca_db
: > ca_db/index.txt
echo 1000 > ca_db/serial
cat > ca.cnf <<CNF
[ca]
default_ca = test_ca
[test_ca]
database = ca_db/index.txt
serial = ca_db/serial
new_certs_dir = ca_db
certificate = ca.pem
private_key = ca.key
default_md = sha256
policy = any
copy_extensions = none
[any]
commonName = supplied
[leaf]
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost
CNF
key expired.key
openssl req -new -key expired.key -subj "/CN=corodist expired server" -out expired.csr
openssl ca -batch -config ca.cnf -extensions leaf -startdate 20200101000000Z -enddate 20200102000000Z \
  -in expired.csr -out expired.pem -notext 2>/dev/null
rm -f ./*.csr
