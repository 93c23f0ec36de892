# Sourced by scripts/serve and scripts/test: the one place that sets up .venv and decides which
# ONNX Runtime wheel it holds, keeping it the only one, so the two scripts run in any order, any
# number of times.
#
# onnxruntime (CPU) and onnxruntime-gpu install the same `onnxruntime` module: with both in one
# environment, uninstalling either deletes files the other needs and `import onnxruntime` then
# yields a module without `get_available_providers`. So .venv holds exactly one: the `gpu` extra
# of pyproject.toml (onnxruntime-gpu on Linux x86-64) where nvidia-smi lists a GPU, the `cpu`
# extra (plain onnxruntime) otherwise. SCEHR_RUNTIME=cpu|gpu chooses on any machine.
#
# Callers set SCEHR_SCRIPT (their name, for messages) and run from the repository root.

# scehr_venv: create .venv (with $PYTHON, default python3) unless it is there.
scehr_venv() {
  if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
  fi
}

# Prints the installed runtime wheels (one per line), then `ok` when the module works or
# `broken: <error>`. One Python start; the marker below lets tests recognise the call.
SCEHR_RUNTIME_PROBE='# scehr-runtime-probe
import importlib.metadata as m
for name in ("onnxruntime", "onnxruntime-gpu"):
    try:
        m.version(name)
        print(name)
    except m.PackageNotFoundError:
        pass
try:
    import onnxruntime
    onnxruntime.get_available_providers()
    print("ok")
except Exception as e:
    print(f"broken: {type(e).__name__}: {e}".splitlines()[0])'

# scehr_runtime [cpu|gpu]: the runtime extra to install (the argument, else SCEHR_RUNTIME, else
# what the machine has).
scehr_runtime() {
  local asked=${1:-${SCEHR_RUNTIME:-}}
  case "$asked" in
    cpu|gpu) echo "$asked" ;;
    "")
      if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        echo gpu
      else
        echo cpu
      fi ;;
    *) echo "$SCEHR_SCRIPT: SCEHR_RUNTIME must be cpu or gpu, not '$asked'" >&2; return 2 ;;
  esac
}

# scehr_runtime_wheel cpu|gpu: the wheel that extra installs here (pyproject.toml's markers:
# onnxruntime-gpu exists for Linux x86-64 only).
scehr_runtime_wheel() {
  if [ "$1" = gpu ] && [ "$(uname -sm)" = "Linux x86_64" ]; then
    echo onnxruntime-gpu
  else
    echo onnxruntime
  fi
}

# scehr_runtime_state: the probe's output for .venv, on one line ("onnxruntime ok").
scehr_runtime_state() {
  .venv/bin/python -c "$SCEHR_RUNTIME_PROBE" 2>&1 | tr '\n' ' ' | sed 's/ $//'
}

# scehr_venv_ready cpu|gpu: whether .venv holds exactly that extra's wheel, and it imports.
scehr_venv_ready() {
  [ "$(scehr_runtime_state)" = "$(scehr_runtime_wheel "$1") ok" ]
}

# scehr_install EXTRA cpu|gpu: pip install -e .[EXTRA,RUNTIME] with exactly one runtime
# wheel afterwards. Whatever else .venv holds (the other wheel, both, a broken module) is
# uninstalled first; a result that is still not right stops with the fix.
scehr_install() {
  local extra=$1 runtime=$2 wheel state
  wheel=$(scehr_runtime_wheel "$runtime")
  state=$(scehr_runtime_state)
  case "$state" in
    "$wheel ok") ;;
    onnxruntime*)  # the other wheel, both, or a module that no longer imports
      echo "$SCEHR_SCRIPT: .venv holds '$state'; the runtime here is $wheel alone:" \
           "uninstalling both wheels, then installing $wheel" >&2
      .venv/bin/python -m pip uninstall -qq -y onnxruntime onnxruntime-gpu ;;
  esac
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e ".[$extra,$runtime]"
  state=$(scehr_runtime_state)
  if [ "$state" != "$wheel ok" ]; then
    {
      echo "$SCEHR_SCRIPT: .venv is not what this script expects: it should hold $wheel alone"
      echo "  and an onnxruntime module that imports; it holds: ${state:-nothing}."
      echo "  Fix: .venv/bin/python -m pip uninstall -y onnxruntime onnxruntime-gpu"
      echo "       then run $SCEHR_SCRIPT again (or delete .venv and run it again)."
    } >&2
    return 1
  fi
}
