"""The convergence table's page (examples/fashion_mnist/table.py) from a
results document of several seeds, without training.

- Each row reports its final accuracy as mean ± sample std over the seeds,
  every seed's figure, and the mean seed-by-seed difference from dense.
- The PowerSGD verdict compares the two PowerSGD rows seed by seed.
- A run cut short within a seed: every row is restricted to the seeds all
  rows have, and the page says what it left out.
- Sections of the page that the table does not write are kept.
- --seeds takes a count or a list and refuses repeats.

Skipped without torch (table.py imports the training module), matplotlib
or scipy.
"""
import argparse
import importlib.util
import pathlib
import sys
import tempfile
import unittest

_HAVE_DEPS = all(importlib.util.find_spec(m) for m in ("matplotlib", "scipy", "torch"))

_EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "fashion_mnist"

DENSE = "dense DDP (Gloo allreduce)"
OURS = "gradcomp powersgd rank 2"
THEIRS = "PyTorch powerSGD_hook rank 2"


def _result(final: float) -> dict:
    return {"accuracy": [final - 0.02, final], "step_seconds": 0.05,
            "cpu_seconds_per_step": 0.02, "bytes_per_step": 2048.0,
            "bytes_per_step_after_epoch1": 1024.0, "raw_bytes_per_step": 4096.0,
            "steps": 20, "wall_seconds": 1.0, "transport": "shm"}


def _document(finals: dict[str, list[float]], seeds: list[int]) -> dict:
    """A results document: row label -> final accuracy per seed run."""
    return {
        "workers": 4, "cores": 2, "parameters": 100, "steps": 20,
        "seeds": seeds, "date": "2026-11-22 00:00 UTC", "wall_minutes": 1.0,
        "spec": {"epochs": 2, "batch_size": 64, "lr": 0.1, "momentum": 0.9},
        "rows": [{"label": label, "settings": "s.",
                  "seeds": seeds[:len(values)],
                  "results": [_result(v) for v in values]}
                 for label, values in finals.items()],
    }


@unittest.skipUnless(_HAVE_DEPS, "needs torch, matplotlib and scipy")
class ConvergencePageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, str(_EXAMPLE))
        import table
        cls.table = table

    def _page(self, finals: dict[str, list[float]], seeds: list[int],
              existing: str = "") -> str:
        with tempfile.TemporaryDirectory() as tmp:
            md, png = pathlib.Path(tmp, "c.md"), pathlib.Path(tmp, "c.png")
            if existing:
                md.write_text(existing)
            self.table.write_page(_document(finals, seeds), md, png)
            self.assertGreater(png.stat().st_size, 0)
            return md.read_text()

    def _all_rows(self, ours: list[float], theirs: list[float]) -> dict:
        labels = [label for label, _, _ in self.table.rows(1)]
        finals = {label: [0.90, 0.91, 0.92] for label in labels}
        finals[OURS], finals[THEIRS] = ours, theirs
        return finals

    def test_mean_std_and_per_seed(self):
        page = self._page(self._all_rows([0.89, 0.90, 0.91], [0.897, 0.907, 0.917]),
                          [0, 1, 2])
        self.assertIn("run_table --epochs 2 --seeds 3", page)
        # 90, 91, 92: mean 91.00, sample std 1.00.
        self.assertIn(f"| {DENSE} | 91.00 ± 1.00 | 90.00 / 91.00 / 92.00 | +0.00 |",
                      page)
        self.assertIn(f"| {OURS} | 90.00 ± 1.00 | 89.00 / 90.00 / 91.00 | -1.00 |",
                      page)
        flat = page.replace("\n", " ")
        self.assertIn("Not within 0.5 points: gradcomp powersgd rank 2.", flat)
        # Paired differences all -0.70: below 0 beyond doubt.
        self.assertIn("seed by seed: -0.70, -0.70, -0.70", flat)
        self.assertIn("target missed", flat)

    def test_powersgd_within_noise_and_met(self):
        noisy = self._page(self._all_rows([0.90, 0.91, 0.92], [0.905, 0.91, 0.918]),
                           [0, 1, 2]).replace("\n", " ")
        self.assertIn("seed by seed: -0.50, +0.00, +0.20", noisy)
        self.assertIn("worse on the mean by 0.10 points", noisy)
        self.assertIn("it holds 0, so the 3 seeds do not tell the two apart", noisy)
        # A positive mean within the noise is no result either (it read
        # "target met" for any mean >= 0).
        lucky = self._page(self._all_rows([0.91, 0.91, 0.92], [0.90, 0.91, 0.92]),
                           [0, 1, 2]).replace("\n", " ")
        self.assertIn("better on the mean by 0.33 points", lucky)
        self.assertIn("it holds 0, so the 3 seeds do not tell the two apart", lucky)
        self.assertNotIn("target met", lucky)
        better = self._page(self._all_rows([0.91, 0.92, 0.93], [0.90, 0.912, 0.921]),
                            [0, 1, 2]).replace("\n", " ")
        self.assertIn("above 0, so gradcomp is better beyond the noise of 3 seeds, "
                      "target met", better)

    def test_one_epoch_has_no_steps_after_it(self):
        # `run_table --epochs 1` trained every row, then divided by the zero
        # bytes per step after epoch 1 while writing the page.
        document = _document(self._all_rows([0.90], [0.90]), [0])
        for row in document["rows"]:
            for result in row["results"]:
                result["bytes_per_step_after_epoch1"] = 0.0
        with tempfile.TemporaryDirectory() as tmp:
            md = pathlib.Path(tmp, "c.md")
            self.table.write_page(document, md, pathlib.Path(tmp, "c.png"))
            self.assertIn("| 2.0 | - | - |", md.read_text())

    def test_results_without_the_dense_row_are_refused(self):
        # --rows results have no dense row: the page compared every row
        # with whichever came first, and called it dense.
        document = _document({OURS: [0.90], THEIRS: [0.90]}, [0])
        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaisesRegex(ValueError, "which the results do not "
                                        "hold first"):
                self.table.write_page(document, pathlib.Path(tmp, "c.md"),
                                      pathlib.Path(tmp, "c.png"))

    def test_cut_short_keeps_common_seeds(self):
        finals = self._all_rows([0.89, 0.90], [0.895, 0.905])
        finals[DENSE] = [0.90, 0.91, 0.50]  # seed 2 ran for dense alone
        page = self._page(finals, [0, 1, 2])
        self.assertIn(f"| {DENSE} | 90.50 ± 0.71 | 90.00 / 91.00 | +0.00 |", page)
        self.assertIn("dense DDP (Gloo allreduce) (seed 2)", page.replace("\n", " "))

    def test_unfinished_seed(self):
        # Seed 1 is missing from the PowerSGD rows: one seed, no std, no
        # verdict.
        page = self._page(self._all_rows([0.899], [0.90]), [0, 1])
        flat = page.replace("\n", " ")
        self.assertIn(f"| {OURS} | 89.90 | 89.90 | -0.10 |", page)
        self.assertIn("this page reports seed(s) 0 only", flat)
        self.assertIn("on one seed, which cannot tell this from noise", flat)

    def test_other_sections_kept(self):
        existing = ("# Convergence\n\nold table\n\n## How to read it\n\nold\n\n"
                    "## Gossip\n\nGossip's own text.\n")
        page = self._page(self._all_rows([0.9] * 2, [0.9] * 2), [0, 1], existing)
        self.assertTrue(page.endswith("## Gossip\n\nGossip's own text.\n"))
        self.assertEqual(page.count("## How to read it"), 1)
        self.assertNotIn("old table", page)

    def test_parse_seeds(self):
        self.assertEqual(self.table.parse_seeds("3"), [0, 1, 2])
        self.assertEqual(self.table.parse_seeds("4,7"), [4, 7])
        for bad in ("0", "1,1", "x", "-1,2"):
            with self.assertRaises(argparse.ArgumentTypeError, msg=bad):
                self.table.parse_seeds(bad)


if __name__ == "__main__":
    unittest.main()
