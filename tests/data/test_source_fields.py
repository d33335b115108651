"""The data section's fields are either every source's or declared by the sources that read them (`reads`): a field
added to DataConfig that no source declares, and that is not every source's, fails here, so a source's option never
lands in the shared section unannounced; a source's field set for another source is refused naming its readers."""

import pytest
import yaml

from genforge.app.config import load_config, to_yaml
from genforge.core.config import DataConfig
from genforge.core.registry import DATA_SOURCES
from genforge.data.base import DataSource

# the fields every source reads (DESIGN.md's data.source, data.path, data.image_size among them), and the
# sections kept by purpose: the built-in shapes (shapes, moving_shapes), clips (video sources and their caches,
# whose token layout families read), joint images (video sources, checked by data.images itself)
EVERY_SOURCE = {"source", "path", "image_size", "flip", "val_fraction", "test_fraction", "split_seed", "split",
                "num_workers", "max_bad_fraction", "max_image_pixels", "shapes", "video", "images"}


def test_every_data_field_is_every_sources_or_declared_by_its_readers():
    declared = {name for source in DATA_SOURCES for name in DATA_SOURCES.get(source).reads}
    assert declared == set(DataSource.SOURCE_FIELDS)
    unowned = set(DataConfig.model_fields) - EVERY_SOURCE - declared
    assert not unowned, f"data fields neither every source's nor read by a declared source: {sorted(unowned)}"
    assert not EVERY_SOURCE & declared


@pytest.mark.parametrize("source", sorted(DATA_SOURCES))
def test_a_field_of_another_source_is_refused_naming_its_readers(source):
    reads = DATA_SOURCES.get(source).reads
    for name, value in {"shuffle_buffer": 5, "image_embeds": "embeds", "label_column": "y"}.items():
        if name in reads:
            continue
        readers = [s for s in DATA_SOURCES if name in DATA_SOURCES.get(s).reads]
        with pytest.raises(ValueError, match=f"data.{name} is not read by data.source={source}; it is read by "
                                             f"data.source {', '.join(readers)}"):
            DataConfig(source=source, path="somewhere", **{name: value})


@pytest.mark.parametrize("source", ["shapes", "folder", "shards", "parquet", "moving_shapes", "video_folder", "arrow"])
def test_a_written_config_carries_its_sources_keys_only(source):
    """config.yaml's data section: the fields every source reads, and those of this source (`reads`, `sections`);
    a preset's shapes section under another source is dropped, as it meant nothing there."""
    written = yaml.safe_load(to_yaml(load_config("dit-shapes", [f"data.source={source}", "data.path=somewhere"])))
    own = DATA_SOURCES.get(source)
    assert set(written["data"]) == EVERY_SOURCE - set(DataSource.SECTIONS) | set(own.reads) | set(own.sections)
    assert ("shapes" in written["data"]) == (source in ("shapes", "moving_shapes"))
