#!/bin/sh
# Cloud AI 100 compile (not verified on hardware)
set -e
cd "$(dirname "$0")"
/opt/qti-aic/exec/qaic-exec -m=../model.onnx -aic-hw -aic-hw-version=2.0 -network-specialization-config=specializations.json -convert-to-fp16 -retained-state -aic-num-cores=14 -custom-IO-list-file=custom_io.yaml -compile-only -aic-binary-dir=qpc -mdp-load-partition-config=mdp_ts_config.json
