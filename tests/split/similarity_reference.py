"""The reference for cleave's image similarity and ROC AUC (tests/split/attacks_test.cc):
scikit-image's SSIM and PSNR, scikit-learn's roc_auc_score.

  similarity_reference.py ssim IN OUT   IN: int32 n, c, h, w, then n truth images and
                                        n others, float32 [c, h, w] in [0, 1];
                                        OUT: float64 ssim, psnr per pair
  similarity_reference.py auc IN OUT    IN: int32 n, then n float64 scores, n int32
                                        labels (0/1); OUT: float64 AUC
"""
import sys

import numpy as np


def ssim(src, dst):
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity
    raw = open(src, "rb").read()
    n, c, h, w = np.frombuffer(raw[:16], dtype=np.int32)
    images = np.frombuffer(raw[16:], dtype=np.float32).reshape(2, n, c, h, w).astype(np.float64)
    out = []
    for truth, other in zip(images[0], images[1]):
        out.append(structural_similarity(truth, other, gaussian_weights=True, sigma=1.5,
                                         use_sample_covariance=False, data_range=1.0, channel_axis=0))
        out.append(peak_signal_noise_ratio(truth, other, data_range=1.0))
    np.asarray(out, dtype=np.float64).tofile(dst)


def auc(src, dst):
    from sklearn.metrics import roc_auc_score
    raw = open(src, "rb").read()
    n = int(np.frombuffer(raw[:4], dtype=np.int32)[0])
    scores = np.frombuffer(raw[4:4 + 8 * n], dtype=np.float64)
    labels = np.frombuffer(raw[4 + 8 * n:], dtype=np.int32)
    np.asarray([roc_auc_score(labels, scores)], dtype=np.float64).tofile(dst)


if __name__ == "__main__":
    {"ssim": ssim, "auc": auc}[sys.argv[1]](sys.argv[2], sys.argv[3])
