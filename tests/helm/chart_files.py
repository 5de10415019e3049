"""The chart's copies of deploy/'s observability files: Helm reads only
inside the chart directory, so helm/gradcomp/files/ holds copies, and
tests/helm/helm_test.py fails when one differs from its source.

    /usr/bin/python3 tests/helm/chart_files.py   # refresh the copies
"""
import pathlib
import shutil

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART_FILES = REPO / "helm" / "gradcomp" / "files"
# chart copy -> source
COPIES = {
    CHART_FILES / "gradcomp-dashboard.json": REPO / "deploy" / "grafana" / "gradcomp-dashboard.json",
    CHART_FILES / "gradcomp-rules.yml": REPO / "deploy" / "prometheus" / "gradcomp-rules.yml",
}

if __name__ == "__main__":
    for copy, source in COPIES.items():
        shutil.copyfile(source, copy)
        print(f"{source.relative_to(REPO)} -> {copy.relative_to(REPO)}")
