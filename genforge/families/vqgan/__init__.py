"""`vqgan`: the VQGAN tokenizer (Esser et al. 2021) as MUSE trains it; VQ (EMA or learnt, cosine), LFQ or FSQ."""
