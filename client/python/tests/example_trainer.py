"""The Fashion-MNIST example's trainer (examples/fashion_mnist/train.py),
for the tests that train with it."""
import pathlib
import sys
import unittest

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "fashion_mnist"


def import_train():
    """Returns the example's `train` module; raises unittest.SkipTest when
    Debian's dataset-fashion-mnist is not installed."""
    sys.path.insert(0, str(EXAMPLE))
    import train
    try:
        train.load_split("t10k", limit=1)
    except FileNotFoundError as error:
        raise unittest.SkipTest(str(error))
    return train
