"""An independent NF4 quantizer (QLoRA, Dettmers et al. 2023), for codec_test.cc.

The code table is built as bitsandbytes' create_normal_map(offset=0.9677083) defines it,
from the normal distribution's quantiles (scipy), not copied from our table. Values are
quantized in blocks of 64 against the block's absmax to the nearest code, and decoded.

  nf4_reference.py IN OUT: IN holds float32 values; OUT gets, as float32: the 16 codes,
  the absmax of each block, then the decoded values.
"""
import sys

import numpy as np
import torch
from scipy.stats import norm


def normal_map(offset=0.9677083):
    v1 = norm.ppf(torch.linspace(offset, 0.5, 9)[:-1]).tolist()  # 8 positive
    v3 = (-norm.ppf(torch.linspace(offset, 0.5, 8)[:-1])).tolist()  # 7 negative
    v = torch.tensor(v1 + [0.0] + v3, dtype=torch.float64)
    v = v.sort().values
    return v / v.max()


def main():
    x = torch.from_numpy(np.fromfile(sys.argv[1], dtype=np.float32)).double()
    codes = normal_map()
    n = x.numel()
    blocks = (n + 63) // 64
    padded = torch.zeros(blocks * 64, dtype=torch.float64)
    padded[:n] = x
    padded = padded.view(blocks, 64)
    absmax = padded.abs().max(dim=1).values.float().double()  # stored as float32
    scaled = torch.where(absmax[:, None] > 0, padded / absmax[:, None], torch.zeros_like(padded))
    index = (scaled[..., None] - codes.float().double()).abs().argmin(dim=-1)
    decoded = (codes.float()[index] * absmax.float()[:, None]).reshape(-1)[:n]
    out = torch.cat([codes.float(), absmax.float(), decoded])
    out.numpy().astype(np.float32).tofile(sys.argv[2])


if __name__ == "__main__":
    main()
