"""A deliberately weak baseline for swarm tests: a bigram model trained with far too small a
learning rate, and no other constant to step, so that half the offline proposer's changes
(LEARNING_RATE times 1.4 or 2) are wins several times larger than the run-to-run noise of a
few-second budget. Not a model anyone should research."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from node.trainer.harness import session

S = session()

LEARNING_RATE = 0.002  # AdamW learning rate: far too small, on purpose


class Bigram(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, idx, targets=None):
        logits = self.table(idx).float()
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


model = Bigram(S.vocab_size).to(S.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
for x, y in S.batches(16):
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

S.finish(model)
