"""What the masked-token generators share above the data and evaluation layers: the config fields and the Task
(MaskGIT's objective, conditioning, guided decoding). Not a family."""
