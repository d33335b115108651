"""core.precision: which precision names a device runs, and the autocast they mean."""

import pytest
import torch

from genforge.core import precision
from genforge.core.config import TrainConfig
from genforge.core.precision import autocast, check_precision


def test_fp16_needs_cuda_and_unknown_names_are_refused_naming_the_setting():
    check_precision("no", "cpu", "--precision no")
    check_precision("bf16", "cpu", "--precision bf16")
    check_precision("fp16", torch.device("cuda", 0), "--precision fp16")  # only checked, nothing runs
    with pytest.raises(ValueError, match=r"^--precision fp16 needs a CUDA GPU .*use bf16 or no here"):
        check_precision("fp16", "cpu", "--precision fp16")
    with pytest.raises(ValueError, match=r"^train.precision=fp16 needs a CUDA GPU"):
        check_precision("fp16", "cpu", "train.precision=fp16")
    with pytest.raises(ValueError, match=r"^--precision fp32: unknown precision; allowed: no, bf16, fp16$"):
        check_precision("fp32", "cpu", "--precision fp32")


def test_autocast_runs_matmuls_in_the_precision_and_no_leaves_float32():
    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with autocast("no", "cpu"):
        assert (a @ b).dtype == torch.float32
    with autocast("bf16", "cpu"):
        product = a @ b
    assert product.dtype == torch.bfloat16
    torch.testing.assert_close(product.float(), a @ b, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("native, resolved", [(True, "bf16"), (False, "no")])
def test_auto_is_bf16_where_the_device_has_it_natively_else_float32_written_resolved(monkeypatch, native, resolved):
    """train.precision: auto resolves when the section is validated (so config.yaml records what trained): bf16 on
    a device with native bf16 (a CUDA GPU with bf16, a CPU with AVX-512-BF16 / AMX), else no; other values stay."""
    monkeypatch.setattr(precision, "native_bf16", lambda: native)
    assert TrainConfig(precision="auto").precision == resolved
    assert TrainConfig.model_validate({"precision": "auto"}).model_dump()["precision"] == resolved
    assert TrainConfig(precision="no").precision == "no" and TrainConfig(precision="bf16").precision == "bf16"
