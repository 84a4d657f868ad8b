"""PyTorch's own mixed precision (``torch.autocast``) on a ``torch.nn.Module``: chosen
submodules kept in float32 with hooks (``hooks``), and a runner that runs the module under
autocast (``runner``). torch is imported only when a module is run."""
