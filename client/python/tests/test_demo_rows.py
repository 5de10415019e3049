"""The rows tools/demo trains (examples/fashion_mnist/quick.py), without
training: every convergence-table row but the skipped ones, each set to
the demo's workers, one epoch and its image limits.

Skipped without torch (quick.py imports the training module).
"""
import importlib.util
import pathlib
import sys
import unittest

_HAVE_TORCH = importlib.util.find_spec("torch") is not None

_EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "fashion_mnist"


@unittest.skipUnless(_HAVE_TORCH, "needs torch")
class DemoRowsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, str(_EXAMPLE))
        import quick
        import table
        import train
        cls.quick, cls.table, cls.train = quick, table, train

    def test_every_table_row_but_the_skipped_with_the_demos_settings(self):
        rows = self.quick.demo_rows(93, workers=3, train_limit=9000,
                                    test_limit=500)
        table_labels = [label for label, _, _ in self.table.rows(93)]
        self.assertEqual([label for label, _ in rows],
                         [label for label in table_labels
                          if label not in self.quick.SKIPPED_ROWS])
        self.assertGreater(len(rows), 2)
        for label, spec in rows:
            self.assertIsInstance(spec, self.train.RunSpec, label)
            self.assertEqual((spec.workers, spec.epochs, spec.train_limit,
                              spec.test_limit, spec.seed), (3, 1, 9000, 500, 0),
                             label)

    def test_seed_and_row_filter(self):
        # What `quick.py --seed 7 --rows powersgd,powerSGD` trains: the two
        # PowerSGD rows, both with seed 7.
        rows = self.quick.demo_rows(93, workers=2, train_limit=12000,
                                    test_limit=2000, seed=7,
                                    words=["powersgd", "powerSGD"])
        self.assertEqual([label for label, _ in rows],
                         ["gradcomp powersgd rank 2",
                          "PyTorch powerSGD_hook rank 2"])
        self.assertEqual([spec.seed for _, spec in rows], [7, 7])


if __name__ == "__main__":
    unittest.main()
