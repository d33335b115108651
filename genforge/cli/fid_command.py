"""`genforge fid A B`: FID between two image folders or statistics files, with the Inception features that
StyleGAN2-ADA / EDM / EDM2 compute (genforge.app.api.fid, docs/evaluation.md); `--save-stats OUT.npz` writes A's
statistics for pytorch-fid, clean-fid and EDM to read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from genforge.app.api import fid as fid_between
from genforge.cli.commands import _check_writable, _fail, app
from genforge.app.outputs import Progress


@app.command("fid")
def fid(
    a: Annotated[Path, typer.Argument(metavar="A", help="an image folder, or statistics: .npz with mu and sigma "
                                                        "(pytorch-fid, clean-fid, EDM) or a genforge .safetensors")],
    b: Annotated[Optional[Path], typer.Argument(metavar="B", help="the same kinds as A (leave out with "
                                                                    "--save-stats to only write A's statistics)")]
    = None,
    save_stats: Annotated[Optional[Path], typer.Option(help="write A's statistics here (.npz, float64 mu [2048] "
                                                            "and sigma [2048, 2048])")] = None,
    batch_size: Annotated[int, typer.Option(min=1, max=4096, help="images per Inception batch")] = 50,
) -> None:
    """FID between A and B: folders of images (any size, read as they are) or their statistics.

    The Inception-v3 pool3 features are those of StyleGAN2-ADA, EDM, EDM2 and clean-fid's legacy_tensorflow mode
    (NVlabs' resize to 299 px), so their .npz statistics and scores compare with these."""
    if save_stats is not None and save_stats.suffix == ".npz":  # other names: refused by the API, naming the option
        _check_writable(save_stats.expanduser().parent, "--save-stats", keep=False)
    bar = Progress("reading", "images")
    try:
        results = fid_between(a, b, save_stats=save_stats, batch_size=batch_size, report=bar.report)
    except (ValueError, FileNotFoundError) as err:  # a missing or empty folder, a file without mu/sigma, no network
        _fail(str(err))
    except OSError as err:  # e.g. the disk filled up while writing --save-stats
        _fail(str(err), code=1)
    done = f"read {bar.done} images" if bar.done else "compared two statistics files"
    bar.finish(done, f"fid {results['fid']:.4g}" if "fid" in results else "")
    for key, value in results.items():
        if value is not None:  # n_a / n_b of an .npz, which does not say
            typer.echo(f"{key:>8}: {value:.4f}" if isinstance(value, float) else f"{key:>8}: {value}")
