"""Models nobody on this project wrote, at tiny sizes: torchvision classifiers, Hugging Face
transformers built from configs (no downloads), recurrent classifiers (nn.LSTM after an
embedding and fed the batch directly, nn.GRU, nn.RNN). Each entry builds
(model, make_optimizer, loss_fn, batches) from a seed."""

from __future__ import annotations

import sys
import types

import torch
from torch import nn

BATCH = 2
IMAGE = 32
CLASSES = 10
VOCAB = 64
SEQ = 8


def import_torchvision():
    """torchvision without its C++ ops: the PyPI wheel for torch's version is a CUDA build
    whose extension cannot load beside a CPU torch (`operator torchvision::nms does not
    exist`, raised while importing its meta registrations); the classifiers need none of
    those ops, so the registrations module is replaced by an empty one. Test code only."""
    if "torchvision" not in sys.modules:
        sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torchvision

    return torchvision


def image_batches(n=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
            for _ in range(n)]


def token_batches(n=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g))
            for _ in range(n)]


def lm_loss(logits, target):
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


class Logits(nn.Module):
    """A Hugging Face model called as users train it: token ids in, logits out."""

    def __init__(self, hf, decoder_inputs: bool = False):
        super().__init__()
        self.hf = hf
        self.decoder_inputs = decoder_inputs

    def forward(self, ids):
        if self.decoder_inputs:  # an encoder-decoder: the decoder reads the same ids, shifted by the model
            return self.hf(input_ids=ids, decoder_input_ids=ids).logits
        return self.hf(input_ids=ids).logits


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, ids):
        out, _ = self.lstm(self.emb(ids))
        return self.head(out[:, -1])


def _sgd(m):
    return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)


def _adamw(m):
    return torch.optim.AdamW(m.parameters(), lr=1e-3)


def _tv(build):
    def make():
        tv = import_torchvision()
        return build(tv.models), _sgd, nn.CrossEntropyLoss(), image_batches()
    return make


def _hf(build, decoder_inputs=False):
    def make():
        import_torchvision()  # (transformers imports torchvision where it is installed)
        import transformers

        m = Logits(build(transformers), decoder_inputs)
        return m, _adamw, lm_loss, token_batches()
    return make


def _convnext(models):
    from torchvision.models.convnext import CNBlockConfig

    return models.convnext.ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)],
                                    stochastic_depth_prob=0.2, num_classes=CLASSES)


def _efficientnet(models):
    from torchvision.models.efficientnet import MBConvConfig

    setting = [MBConvConfig(1, 3, 1, 16, 8, 1), MBConvConfig(6, 3, 2, 8, 16, 2), MBConvConfig(6, 5, 2, 16, 24, 1)]
    return models.efficientnet.EfficientNet(setting, dropout=0.2, stochastic_depth_prob=0.2, num_classes=CLASSES)


def _mobilenet_v3(models):
    from torchvision.models.mobilenetv3 import _mobilenet_v3_conf

    # mobilenet_v3_small's first four blocks (SE, hardswish and ReLU blocks, strides 1 and 2)
    setting, _ = _mobilenet_v3_conf("mobilenet_v3_small")
    return models.mobilenetv3.MobileNetV3(setting[:4], last_channel=64, num_classes=CLASSES)


class RecurrentClassifier(nn.Module):
    """An nn.LSTM, nn.GRU or nn.RNN reading the batch (features per time step) directly."""

    def __init__(self, rnn: nn.RNNBase):
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(rnn.hidden_size, CLASSES)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1] if self.rnn.batch_first else out[-1])


FEATURES = 16


def sequence_batches(batch_first: bool, n=3, seed=1, seq=SEQ):
    g = torch.Generator().manual_seed(seed)
    shape = (BATCH, seq, FEATURES) if batch_first else (seq, BATCH, FEATURES)
    return [(torch.randn(*shape, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(n)]


def _lstm():
    def lstm_batches(n=3, seed=1):
        g = torch.Generator().manual_seed(seed)
        return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
                for _ in range(n)]
    return LSTMClassifier(), _adamw, nn.CrossEntropyLoss(), lstm_batches()


def _recurrent(kind, batch_first, **options):
    def make():
        rnn = getattr(nn, kind)(FEATURES, 32, batch_first=batch_first, **options)
        return RecurrentClassifier(rnn), _sgd, nn.CrossEntropyLoss(), sequence_batches(batch_first)
    return make


MODELS = {
    "resnet": _tv(lambda m: m.ResNet(m.resnet.BasicBlock, [1, 1, 1, 1], num_classes=CLASSES)),
    "densenet": _tv(lambda m: m.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2,
                                         num_classes=CLASSES)),
    "mobilenet_v3": _tv(_mobilenet_v3),
    "efficientnet": _tv(_efficientnet),
    "vit": _tv(lambda m: m.VisionTransformer(image_size=IMAGE, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                             mlp_dim=64, num_classes=CLASSES)),
    "convnext": _tv(_convnext),
    "gpt2": _hf(lambda t: t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB,
                                                         n_positions=SEQ * 2))),
    "bert": _hf(lambda t: t.BertForMaskedLM(t.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                         intermediate_size=64, vocab_size=VOCAB,
                                                         max_position_embeddings=SEQ * 2))),
    "llama": _hf(lambda t: t.LlamaForCausalLM(t.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                            num_attention_heads=2, num_key_value_heads=1,
                                                            vocab_size=VOCAB, max_position_embeddings=SEQ * 2))),
    "t5": _hf(lambda t: t.T5ForConditionalGeneration(t.T5Config(d_model=32, d_ff=64, d_kv=16, num_layers=1,
                                                                num_heads=2, vocab_size=VOCAB)), decoder_inputs=True),
    "lstm": _lstm,
    "lstm_direct": _recurrent("LSTM", False, num_layers=2),
    "gru": _recurrent("GRU", True, num_layers=2),
    "rnn": _recurrent("RNN", False),
}
RECURRENT = ("lstm", "lstm_direct", "gru", "rnn")
