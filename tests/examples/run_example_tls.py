#!/usr/bin/env python3
"""Runs an example under corodist-run with mutual TLS and checks its output as
run_example.py does: makes a test CA and certificate with
scripts/make_test_certs.sh (the openssl command-line tool) in a temporary
directory, passes them to corodist-run (--tls-cert/--tls-key/--tls-ca, which
exports CORODIST_TLS_* to the ranks), and removes the directory afterwards.
Exits 77 (meson: skipped) when openssl is missing.
Usage: run_example_tls.py MAKE_CERTS PATTERN COUNT -- CORODIST_RUN ARGS..."""
import os
import shutil
import subprocess
import sys
import tempfile


def main() -> int:
    make_certs, pattern, count, sep, launcher, *args = sys.argv[1:]
    assert sep == "--", __doc__
    if shutil.which("openssl") is None:
        print("SKIP: the openssl command-line tool is missing: it makes the test certificates")
        return 77
    run_example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_example.py")
    with tempfile.TemporaryDirectory(prefix="corodist-tls-") as d:
        made = subprocess.run(["bash", make_certs, d], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if made.returncode != 0:
            print(f"FAIL: {make_certs} exited with {made.returncode}:\n{made.stdout}")
            return 1
        # server.pem is valid for both roles (serverAuth, clientAuth) and 127.0.0.1.
        tls = ["--tls-cert", os.path.join(d, "server.pem"), "--tls-key", os.path.join(d, "server.key"),
               "--tls-ca", os.path.join(d, "ca.pem")]
        return subprocess.run([sys.executable, run_example, pattern, count, "--", launcher, *tls, *args]).returncode


if __name__ == "__main__":
    sys.exit(main())
