"""How a model is trained: the training modes, trainers, update engines (PyTorch, DeepSpeed), checkpoints."""
