import torch

from genforge.core.codec import LatentCodec
from genforge.tokenizers.standins import SpaceToDepthCodec


def test_space_to_depth_is_exact_and_shapes_follow_the_interface():
    codec = SpaceToDepthCodec(3, factor=2, scale=0.5)
    assert isinstance(codec, LatentCodec)
    image = torch.rand(2, 3, 16, 16) * 2 - 1
    latent = codec.encode(image)
    assert latent.shape == (2, codec.latent_channels, 8, 8) == (2, 12, 8, 8)
    assert torch.equal(codec.decode(latent), image)
    assert torch.allclose(latent.std(), image.std() * 0.5, rtol=0.05)
