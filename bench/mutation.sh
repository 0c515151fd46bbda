#!/usr/bin/env bash
# Mutation testing of the core modules with mutmut 3 (pip install -e '.[dev]').
#
#   bench/mutation.sh                      # every core module
#   bench/mutation.sh schedules/ir.py      # some of them
#
# Each mutant (an operator, constant or call changed in one function) runs the fast
# in-process tests that call that function (mutmut records which, in one clean run first);
# a mutant is killed when one of them fails. mutmut writes its mutants/ folder beside the
# code, so this runs in a scratch copy of the work tree (MUTATION_DIR, default a new folder
# under /tmp) and prints, per module, killed / total and every survivor with its diff.
# Multi-process tests (torchrun, spawned ranks) are left out: mutmut sees only the calls made
# inside its own pytest process, and they would take hours. PYTHON picks the interpreter,
# JOBS the parallel mutants (default 2). On the shared 2-core machine wrap it:
#   flock /work/wt/cpu.lock nice -n 10 bench/mutation.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
JOBS=${JOBS:-2}
CORE=(schedules/ir.py schedules/lowering.py schedules/validate.py sim/engine.py sim/calibration.py
      runtime/reference.py runtime/record.py)
MODULES=("${@:-${CORE[@]}}")
TESTS=(tests/test_schedules_ir.py tests/test_schedules_validation.py tests/test_schedules_io.py
       tests/test_schedules_generators.py tests/test_sim_closed_forms.py tests/test_sim_engine.py
       tests/test_sim_oracle.py tests/test_sim_costs.py tests/test_calibrate.py tests/test_runtime_units.py
       tests/test_record.py tests/test_sim_data_parallel.py)

WORK=${MUTATION_DIR:-$(mktemp -d /tmp/bubblescope-mutation.XXXXXX)}
mkdir -p "$WORK"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$WORK"
cd "$WORK"
for m in "${MODULES[@]}"; do
    [ -f "$m" ] || { echo "bench/mutation.sh: no module $m" >&2; exit 2; }
done

# mutmut reads [mutmut] from setup.cfg: whole packages are copied to mutants/ (so that they
# import whole from there), only the modules asked for are mutated.
{
    echo "[mutmut]"
    echo "source_paths ="
    printf '    %s\n' schedules/ sim/ runtime/
    echo "only_mutate ="
    printf '    %s\n' "${MODULES[@]}"
    echo "pytest_add_cli_args_test_selection ="
    printf '    %s\n' "${TESTS[@]}"
    echo "use_git_change_detection = false"
} > setup.cfg

# No PYTHONPATH: mutmut puts mutants/ first on sys.path once it exists (a path on it before
# then is cached as missing, and the editable install's originals would be tested instead).
unset PYTHONPATH
export OMP_NUM_THREADS=1 MPLBACKEND=Agg
# Through cli(), not `python -m mutmut`: the mutants import mutmut.__main__, which must be
# the module already running.
MUTMUT=(-c 'import sys; from mutmut.__main__ import cli; sys.argv[0] = "mutmut"; cli()')
started=$(date +%s)
"$PY" "${MUTMUT[@]}" run --max-children "$JOBS" > mutmut-run.log 2>&1 || { tail -c 3000 mutmut-run.log; exit 1; }
"$PY" "${MUTMUT[@]}" results --all true > results.txt
echo "mutation testing of ${MODULES[*]}: $(( $(date +%s) - started )) s, in $WORK"
"$PY" - "${MODULES[@]}" <<'PY'
import sys
from collections import Counter

rows = [line.strip().rsplit(": ", 1) for line in open("results.txt") if ": " in line]
for module in sys.argv[1:]:
    prefix = module[:-3].replace("/", ".") + "."
    mine = [(name, status) for name, status in rows if name.startswith(prefix)]
    count = Counter(status for _, status in mine)
    tested = len(mine) - count["no tests"] - count["skipped"]
    score = f"{count['killed'] / tested:.1%}" if tested else "-"
    print(f"{module}: {count['killed']} killed of {tested} tested ({score}); "
          + ", ".join(f"{n} {s}" for s, n in sorted(count.items()) if s != "killed"))
PY
echo
echo "survivors (in $WORK: python -c '...cli()' show NAME, as above, for each diff):"
grep -v ": killed$" results.txt || true
