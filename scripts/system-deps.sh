#!/usr/bin/env bash
# Installs the system packages neonic needs, only those that are missing:
#   iverilog (cocotb benches), g++ make perl (Verilator builds), python3-venv (the .venv).
# Uses apt-get directly as root, through sudo otherwise. Does nothing when all are present.
set -euo pipefail
missing=()
command -v iverilog >/dev/null 2>&1 || missing+=(iverilog)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v perl >/dev/null 2>&1 || missing+=(perl)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing system packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
