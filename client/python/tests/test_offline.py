"""Tests of the parts of the gradcomp package that need no daemon."""
import unittest

import numpy as np

from gradcomp import codec_spec, metrics, resnet50


class ResNet50Test(unittest.TestCase):

    def test_parameter_set_matches_torchvision_resnet50(self):
        params = resnet50.parameters()
        self.assertEqual(len(params), 161)
        self.assertEqual(sum(p.numel for p in params), 25_557_032)
        names = [p.name for p in params]
        self.assertEqual(len(set(names)), len(names))
        shapes = {p.name: p.shape for p in params}
        self.assertEqual(shapes["conv1.weight"], (64, 3, 7, 7))
        self.assertEqual(shapes["layer3.0.downsample.0.weight"], (1024, 512, 1, 1))
        self.assertEqual(shapes["layer4.2.conv2.weight"], (512, 512, 3, 3))
        self.assertEqual(shapes["fc.weight"], (1000, 2048))

    def test_synthetic_gradients_are_reproducible_float32_and_heavy_tailed(self):
        a = resnet50.synthetic_gradients(seed=3)
        b = resnet50.synthetic_gradients(seed=3)
        for p in resnet50.parameters():
            self.assertEqual(a[p.name].shape, p.shape)
            self.assertEqual(a[p.name].dtype, np.float32)
            np.testing.assert_array_equal(a[p.name], b[p.name])
        w = a["layer3.1.conv2.weight"].astype(np.float64).ravel()
        kurtosis = np.mean(w ** 4) / np.mean(w ** 2) ** 2
        self.assertGreater(kurtosis, 6.0, "a Gaussian has 3; gradients are heavier")
        self.assertFalse(np.array_equal(a["fc.weight"],
                                        resnet50.synthetic_gradients(seed=4)["fc.weight"]))


class CodecSpecTest(unittest.TestCase):

    def test_none_lets_policy_decide(self):
        self.assertIsNone(codec_spec(None, None))

    def test_params_become_strings(self):
        spec = codec_spec("topk", {"ratio": 0.01, "momentum": 0.9, "nesterov": True})
        self.assertEqual(spec.name, "topk")
        self.assertEqual(dict(spec.params),
                         {"ratio": "0.01", "momentum": "0.9", "nesterov": "true"})

    def test_params_without_codec_rejected(self):
        with self.assertRaisesRegex(ValueError, "without a codec"):
            codec_spec(None, {"ratio": 0.1})


class MetricsParseTest(unittest.TestCase):

    def test_parses_labels_and_sums(self):
        text = "\n".join([
            "# HELP gradcomp_reduce_total Reduce calls.",
            "# TYPE gradcomp_reduce_total counter",
            'gradcomp_reduce_total{codec="topk",code="OK"} 3',
            'gradcomp_reduce_total{codec="topk",code="INVALID_ARGUMENT"} 2',
            'gradcomp_reduce_total{codec="none",code="OK"} 5 1700000000000',
            'gradcomp_build_info{version="a \\"b\\"",wire_format="1"} 1',
            "gradcomp_state_bytes 1.5e+03",
        ])
        samples = metrics.parse(text)
        self.assertEqual(len(samples), 5)
        self.assertEqual(metrics.total(samples, "gradcomp_reduce_total", codec="topk"), 5)
        self.assertEqual(metrics.total(samples, "gradcomp_reduce_total", code="OK"), 8)
        self.assertEqual(metrics.total(samples, "gradcomp_state_bytes"), 1500)
        self.assertEqual(samples[3].labels["wire_format"], "1")

    def test_rejects_garbage(self):
        with self.assertRaises(ValueError):
            metrics.parse("{not a metric} 1")


if __name__ == "__main__":
    unittest.main()
