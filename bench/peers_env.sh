#!/bin/sh
# The virtual environment of bench/remote_peers.py (remote.py --peers) and
# bench/cluster_peers.py (cluster.py --peers): Mosaic Streaming and LitData beside a CPU
# torch 2.13.0, apart from the project's .venv, with the Spark (pyspark, pandas and pyarrow,
# for Mosaic's dataframe_to_mds; Java from the OS, as `make cluster` installs it) that drives
# Mosaic's writer. Made once; run again after this file changed, it installs again.
#
# Both libraries depend on torch and torchvision, through which pip would fetch another
# torch (a CUDA build, gigabytes): they are installed without their dependencies, and the
# packages their imports need are named here. No torchvision: its builds on PyPI load only
# against a CUDA torch, so remote_peers.py does without it (the crop and the flip are PIL's,
# as pipelines.py writes them for the other benches).
set -eu
cd "$(dirname "$0")"
VENV=.venv-peers
STAMP=$VENV/.installed
if [ -f "$STAMP" ] && [ "$STAMP" -nt peers_env.sh ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip install --quiet"
$PIP "torch==2.13.0" "numpy>=1.21.5,<2.2" pillow
$PIP --no-deps "mosaicml-streaming==0.13.0" "litdata==0.2.76"
# What `import streaming` and `import litdata` need, and what they read S3 with, in the
# versions Mosaic asks for (pip says what else they would want: Azure, GCS, OCI, torchvision).
$PIP "boto3<2" "xxhash<4" "zstd<2" "python-snappy<1" Brotli "catalogue<3" tqdm filelock requests \
    urllib3 "transformers<5" lightning-utilities obstore
# Spark for Mosaic's dataframe_to_mds, in the versions of the project's .venv.
$PIP "pyspark==4.3.0" "pandas==3.1.1" "pyarrow==26.0.1"
"$VENV/bin/python" -c "import litdata, pyspark, remote_peers; remote_peers.import_streaming(); import streaming.base.converters"
touch "$STAMP"
