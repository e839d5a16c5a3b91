"""The fuzz suite (tests/fuzz.py) at CI size: 16 families (tests/fuzz.py FAMILIES, the issue-47 ones of fuzz_types.py included) x 60 seeded cases, each in a forked child with a
memory limit and an alarm; no crash, hang, unclear exception or silent acceptance. The long run:
`python tests/fuzz.py --long` (>= 10,000 cases; counts in the README's reliability section)."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_fuzz_suite_finds_no_crash_hang_unclear_error_or_silent_acceptance(tmp_path):
    # a script's own folder (tests/) is on its path; PYTHONPATH gives it the package when it is not installed
    r = subprocess.run([sys.executable, os.path.join(REPO, "tests", "fuzz.py"), "--work", str(tmp_path)], cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=600)
    report = json.loads(r.stdout)
    assert report["failures"] == [], json.dumps(report["failures"][:20], indent=1)
    assert r.returncode == 0, r.stderr[-2000:]
    from fuzz import CI_CASES, FAMILIES
    assert report["cases"] == CI_CASES * len(FAMILIES)
    for family in FAMILIES:            # every family ran, and its mutations were caught
        counts = report["by_family"][family]
        assert sum(counts.values()) == CI_CASES and counts.get("rejected", 0) >= CI_CASES // 2, (family, counts)
