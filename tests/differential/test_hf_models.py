"""Hugging Face architectures (small configs, random weights) compiled with `cuvil.compile` against
an fp64 run of the same model: Cuvil's error may be at most twice eager fp32's own, plus 1e-5 of
the output's scale. Each case is one that a survey of 65 architectures found failing: options
passed as keywords into `**kwargs`, string type hints, guards on sizes torch.export could not
prove, nested floor divisions of a dynamic height, a huge pooling window, and depthwise
convolutions."""
import copy
import subprocess
import sys

import pytest
import torch
import transformers

import cuvil


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Random weights and batch-norm statistics (some configs initialise layers to zero, which
    would make every output 0 and the comparison vacuous)."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            centre = 1.0 if name.endswith("weight") and p.dim() == 1 else 0.0
            p.copy_(torch.randn(p.shape, generator=g) * (0.2 if p.dim() > 1 else 0.5) + centre)
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
    return model.eval()


def assert_close_to_fp64(model, got: torch.Tensor, *args, pick=lambda out: out[0], **kwargs):
    with torch.no_grad():
        fp32 = pick(model(*args, **kwargs))
        fp64 = pick(copy.deepcopy(model).double()(*[a.double() if a.is_floating_point() else a for a in args],
                                                  **kwargs)).float()
    scale = float(fp64.abs().max())
    assert scale > 0
    eager_error = float((fp32 - fp64).abs().max())
    assert float((got - fp64).abs().max()) <= 2 * eager_error + 1e-5 * scale


def test_keyword_options_that_land_in_kwargs():
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64, vocab_size=100)
    model = randomize(transformers.BertModel(cfg))
    c = cuvil.compile(model)
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    as_tuple = c(ids, return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 2
    assert_close_to_fp64(model, as_tuple[0], ids)
    # at a second length the sequence dim becomes dynamic, and torch.export needs the keyword named
    for ids in (ids, torch.randint(0, 100, (1, 17), generator=torch.Generator().manual_seed(2))):
        out = c(ids, output_hidden_states=True)
        assert len(out.hidden_states) == 3
        for i in range(3):
            assert_close_to_fp64(model, out.hidden_states[i], ids, output_hidden_states=True,
                                 pick=lambda o, i=i: o.hidden_states[i])
    assert any("dynamic" in line for line in c.explain_recompiles())


def test_sequence_classification_with_string_type_hints_and_a_dynamic_length():
    # its forward's hints (`Optional[torch.Tensor]`, `Unpack[...]`) are strings: not shape annotations
    cfg = transformers.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, vocab_size=100, max_position_embeddings=64, pad_token_id=0)
    model = randomize(transformers.LlamaForSequenceClassification(cfg))
    c = cuvil.compile(model, dynamic={"input_ids": {1: "seq"}})
    g = torch.Generator().manual_seed(2)
    for n in (12, 20):
        ids = torch.randint(1, 100, (2, n), generator=g)
        assert_close_to_fp64(model, c(ids, use_cache=False).logits, ids, use_cache=False,
                             pick=lambda o: o.logits)
    assert c.explain_recompiles() == []


def test_audio_of_any_length_in_one_program():
    # guards on the length (`1 % (n//20 - 1) != 0`) that torch's solver cannot prove over a range
    cfg = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2),
                                      conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                                      num_conv_pos_embedding_groups=2)
    model = randomize(transformers.Wav2Vec2Model(cfg))
    c = cuvil.compile(model, dynamic=[{1: "n"}])
    g = torch.Generator().manual_seed(3)
    for n in (1600, 2345, 999):
        x = torch.randn(1, n, generator=g)
        assert_close_to_fp64(model, c(x)[0], x)
    assert c.explain_recompiles() == []


def test_a_resnet_with_dynamic_height_and_width():
    cfg = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 32, 64], depths=[1, 1, 1, 1])
    model = randomize(transformers.ResNetModel(cfg))
    c = cuvil.compile(model, dynamic=[{2: "h", 3: "w"}], ranges={"h": (33, 128), "w": (33, 136)})
    g = torch.Generator().manual_seed(4)
    for h, w in ((64, 72), (77, 85), (33, 136)):
        x = torch.randn(1, 3, h, w, generator=g)
        assert_close_to_fp64(model, c(x)[0], x)
    assert c.explain_recompiles() == []


def test_efficientnet_with_dynamic_height_and_width():
    # its pooler's 640x640 window (ceil_mode) gives a 1x1 map at every size of the range: a size
    # expression the ranges pin to 1, which the verifier checks over the ranges
    model = randomize(transformers.EfficientNetModel(transformers.EfficientNetConfig(
        image_size=128, width_coefficient=0.5, depth_coefficient=0.5, hidden_dim=640)))
    c = cuvil.compile(model, dynamic=[{2: "h", 3: "w"}], ranges={"h": (64, 160), "w": (64, 160)})
    g = torch.Generator().manual_seed(7)
    for h, w in ((128, 128), (97, 150)):
        x = torch.randn(1, 3, h, w, generator=g)
        out = c(x)
        assert_close_to_fp64(model, out[0], x)
        assert_close_to_fp64(model, out[1], x, pick=lambda o: o[1])
    assert c.explain_recompiles() == []


@pytest.mark.parametrize("name", ["efficientnet", "convnext", "mobilenet_v2"])
def test_depthwise_convolution_models(name):
    # EfficientNet pools its 4x4 map with a 640x640 window; all three are built on depthwise convolutions
    model = randomize({
        "efficientnet": lambda: transformers.EfficientNetModel(transformers.EfficientNetConfig(
            image_size=128, width_coefficient=0.5, depth_coefficient=0.5, hidden_dim=640)),
        "convnext": lambda: transformers.ConvNextModel(transformers.ConvNextConfig(
            hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1])),
        "mobilenet_v2": lambda: transformers.MobileNetV2Model(transformers.MobileNetV2Config(
            image_size=128, depth_multiplier=0.5)),
    }[name]())
    x = torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(5))
    out = cuvil.compile(model)(x)
    assert_close_to_fp64(model, out[0], x)
    assert_close_to_fp64(model, out[1], x, pick=lambda o: o[1])


def test_weight_standardised_convolutions():
    # BiT normalises each convolution's weights by their own statistics (batch norm, training mode,
    # no running statistics), folded at compile time
    cfg = transformers.BitConfig(embedding_size=32, hidden_sizes=[32, 64, 64, 128], depths=[1, 1, 1, 1], num_groups=8)
    model = randomize(transformers.BitModel(cfg))
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(6))
    assert_close_to_fp64(model, cuvil.compile(model)(x)[0], x)


_IDS = torch.randint(1, 100, (1, 16), generator=torch.Generator().manual_seed(7))
_IMAGE = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(8))
WITHOUT_DECOMPOSITIONS = {
    # model, input, keywords; what its graph holds that once needed run_decompositions
    "gpt2": (lambda: transformers.GPT2Model(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=100)),
             _IDS, {"use_cache": False}),                                   # torch.diff of the positions
    "qwen2": (lambda: transformers.Qwen2Model(transformers.Qwen2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=100)), _IDS, {"use_cache": False}),                      # torch.diff
    "t5_encoder": (lambda: transformers.T5EncoderModel(transformers.T5Config(
        d_model=64, num_layers=2, num_heads=2, d_ff=128, d_kv=32, vocab_size=100)), _IDS, {}),   # where, min, +=
    "roberta": (lambda: transformers.RobertaModel(transformers.RobertaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=100)),
        _IDS, {}),                                                          # type_as
    "resnet": (lambda: transformers.ResNetModel(transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32],
                                                                          depths=[1, 1])), _IMAGE, {}),   # +=
    "swin": (lambda: transformers.SwinModel(transformers.SwinConfig(
        image_size=64, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4)), _IMAGE, {}),   # pool1d
    "levit": (lambda: transformers.LevitModel(transformers.LevitConfig(image_size=64)), _IMAGE,
              {}),                                                          # hardswish, reshape_as
    "deberta": (lambda: transformers.DebertaModel(transformers.DebertaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=100)),
        _IDS, {}),                                                          # chunk
    "wav2vec2": (lambda: transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, conv_dim=(32, 32),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)),
        torch.randn(1, 4000, generator=torch.Generator().manual_seed(9)), {}),   # weight_norm
    "efficientnet": (lambda: transformers.EfficientNetModel(transformers.EfficientNetConfig(
        image_size=64, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320)), _IMAGE,
        {}),                                                                # conv2d(padding="same")
    "bloom": (lambda: transformers.BloomModel(transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=2,
                                                                       vocab_size=100)),
              _IDS, {"use_cache": False}),                                 # baddbmm
    "falcon": (lambda: transformers.FalconModel(transformers.FalconConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=100)), _IDS, {"use_cache": False}),  # x.T
    "gptj": (lambda: transformers.GPTJModel(transformers.GPTJConfig(n_embd=64, n_layer=2, n_head=2, rotary_dim=16,
                                                                    vocab_size=100)),
             _IDS, {"use_cache": False}),                                  # torch.stack
}


@pytest.mark.parametrize("name", WITHOUT_DECOMPOSITIONS)
def test_models_import_without_run_decompositions(name, monkeypatch):
    """These graphs hold only ops Cuvil imports directly, in-place ones on the model's own tensors
    among them, so capture skips `run_decompositions` (0.3-0.6 s each here: it traces the model
    again)."""
    make, x, keywords = WITHOUT_DECOMPOSITIONS[name]
    # LeViT's twelve attention and MLP stages overflow with `randomize`'s weights (eager's fp32 too)
    model = make().eval() if name == "levit" else randomize(make())

    def refuse(*_, **__):
        raise AssertionError("run_decompositions was called")
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", refuse)
    out = cuvil.compile(model, cache=False)(x, **keywords)
    assert_close_to_fp64(model, out[0], x, **keywords)


DECODERS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=100)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2,
                                                                         vocab_size=100)),
}


@pytest.mark.parametrize("name", DECODERS)
def test_a_decoder_called_the_default_way_returns_its_key_value_cache(name):
    """`use_cache=True` is a decoder's default: its output holds a DynamicCache, which torch.export
    could not capture until Cuvil registered transformers' caches. The compiled call's cache holds
    Cuvil's keys and values, and eager decoding goes on from it."""
    model = randomize(DECODERS[name]())
    ids = torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(3))
    out = cuvil.compile(model, cache=False)(ids)
    assert isinstance(out.past_key_values, transformers.DynamicCache)
    assert out.past_key_values.get_seq_length() == 12
    assert_close_to_fp64(model, out.logits, ids, pick=lambda o: o.logits)
    for i, layer in enumerate(out.past_key_values.layers):
        assert_close_to_fp64(model, layer.keys, ids, pick=lambda o, i=i: o.past_key_values.layers[i].keys)
        assert_close_to_fp64(model, layer.values, ids, pick=lambda o, i=i: o.past_key_values.layers[i].values)
    nxt = torch.randint(1, 100, (1, 1), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        own = model(ids).past_key_values
        want = model(nxt, past_key_values=own).logits
        got = model(nxt, past_key_values=out.past_key_values).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("name", DECODERS)
def test_a_decoding_loop_runs_compiled_with_one_program_for_every_length(name):
    """A decoding step (a DynamicCache passed in) compiles once: the cache's length is one dynamic
    size, shared by every layer. The model appends to the cache it is given, in place, so the
    caller's cache object is updated as eager's would be. Steps of one token and of three (the new
    tokens dynamic), then steps with an attention mask over the past and new tokens (its size
    that length + 1: one more variant), against eager's own loop."""
    model = randomize(DECODERS[name]())
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 100, (1, 12), generator=gen)
    compiled = cuvil.compile(model, cache=False, dynamic={"input_ids": {1: "tokens"}})
    with torch.no_grad():
        mine, own = compiled(ids).past_key_values, model(ids).past_key_values
        length = 12
        for n, masked in ((1, False), (1, False), (3, False), (1, False), (1, True), (1, True), (1, True)):
            tokens = torch.randint(1, 100, (1, n), generator=gen)
            length += n
            mask = {"attention_mask": torch.ones(1, length, dtype=torch.long)} if masked else {}
            got = compiled(tokens, past_key_values=mine, **mask)
            want = model(tokens, past_key_values=own, **mask)
            assert got.past_key_values is mine                      # the caller's cache, updated
            assert mine.get_seq_length() == own.get_seq_length() == length
            torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5 * float(want.logits.abs().max()))
    for a, b in zip(mine.layers, own.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-5 * float(b.keys.abs().max()))
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=1e-5 * float(b.values.abs().max()))
    # the prompt's, every step's without a mask, every step's with one
    assert compiled.num_variants == 3, compiled.explain_recompiles()


def test_a_cache_longer_than_its_range_recompiles_with_the_range_doubled():
    """The cache's length is the dim `past` (ranges={"past": ...} sets it); a longer cache
    recompiles once with its range doubled, not once a token."""
    model = randomize(DECODERS["llama"]())
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 100, (1, 12), generator=gen)
    compiled = cuvil.compile(model, cache=False, ranges={"past": (1, 14)})
    with torch.no_grad():
        mine, own = compiled(ids).past_key_values, model(ids).past_key_values
        for _ in range(6):                                  # past 12 .. 17
            tokens = torch.randint(1, 100, (1, 1), generator=gen)
            got, want = compiled(tokens, past_key_values=mine), model(tokens, past_key_values=own)
            torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5 * float(want.logits.abs().max()))
    assert compiled.num_variants == 3
    assert "past (s0) is outside its compiled range [1, 14]" in compiled.explain_recompiles()[-1]
    assert compiled.explain_recompiles()[-1].endswith("-> range of past widened to [1, 28]")


@pytest.mark.parametrize("with_config", [True, False])
def test_an_empty_cache_passed_with_the_prompt_is_filled_in_place(with_config):
    """HF's own examples make an empty DynamicCache and pass it with the prompt: the compiled call
    fills the caller's object (its layers made with a config, or made by the model without one),
    and the steps go on from it."""
    model = randomize(DECODERS["llama"]())
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(1, 100, (1, 12), generator=gen)

    def empty():
        return transformers.DynamicCache(config=model.config) if with_config else transformers.DynamicCache()
    compiled, mine, own = cuvil.compile(model, cache=False), empty(), empty()
    with torch.no_grad():
        for tokens in (ids, *(torch.randint(1, 100, (1, 1), generator=gen) for _ in range(3))):
            got, want = compiled(tokens, past_key_values=mine), model(tokens, past_key_values=own)
            assert got.past_key_values is mine and mine.get_seq_length() == own.get_seq_length()
            torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5 * float(want.logits.abs().max()))
    assert mine.get_seq_length() == 15 and compiled.num_variants == 2


SLIDING = {
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=100, sliding_window=6)),
    # a local layer and a global one: the global layer's keys grow with past, the local one's stay 5
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=100, head_dim=16, sliding_window=6, layer_types=["sliding_attention", "full_attention"])),
}


@pytest.mark.parametrize("name", SLIDING)
def test_sliding_window_steps_compile_once_growing_and_once_full(name):
    """Mistral's (and Gemma's) caches hold DynamicSlidingWindowLayers, which count the tokens seen
    in a Python int: each step was refused, and then every step from the one that fills a window.
    While a window grows, its steps run one program (the count read from the keys' length); once
    it is full they run another (the count the length of an empty tensor in the int's place, and
    the new count one the program returns). Every step's logits, keys and count are eager's,
    through the window's filling by one token and by three, and with an attention mask."""
    model = randomize(SLIDING[name]())
    gen = torch.Generator().manual_seed(8)
    compiled = cuvil.compile(model, cache=False)

    def step(mine, own, tokens, **kwargs):
        got, want = compiled(tokens, past_key_values=mine, **kwargs), model(tokens, past_key_values=own, **kwargs)
        assert got.past_key_values is mine
        assert [a.cumulative_length for a in mine.layers if hasattr(a, "sliding_window")] == \
            [b.cumulative_length for b in own.layers if hasattr(b, "sliding_window")]
        for a, b in zip(mine.layers, own.layers, strict=True):
            torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=1e-6 * float(b.keys.abs().max()))
        torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-5 * float(want.logits.abs().max()))

    with torch.no_grad():
        ids = torch.randint(1, 100, (1, 3), generator=gen)
        mine, own = compiled(ids).past_key_values, model(ids).past_key_values
        assert type(mine.layers[0]).__name__ == "DynamicSlidingWindowLayer"
        for _ in range(7):                                      # past 3 .. 9: full from 6 on
            step(mine, own, torch.randint(1, 100, (1, 1), generator=gen))
        assert compiled.num_variants == 3                       # the prompt's, the growing window's, the full one's
        assert mine.layers[0].keys.shape[-2] == 5 and mine.get_seq_length() == 10
        n = mine.get_seq_length()
        step(mine, own, torch.randint(1, 100, (1, 1), generator=gen), attention_mask=torch.ones(1, n + 1, dtype=torch.long))
        for _ in range(2):                                      # three tokens a step in the full window
            step(mine, own, torch.randint(1, 100, (1, 3), generator=gen))
        ids = torch.randint(1, 100, (1, 4), generator=gen)      # a window filled part way by one step
        mine, own = compiled(ids).past_key_values, model(ids).past_key_values
        for _ in range(3):
            step(mine, own, torch.randint(1, 100, (1, 3), generator=gen))
    assert mine.get_seq_length() == own.get_seq_length() == 13


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_generate_with_a_compiled_forward(name):
    """`model.forward = cuvil.compile(model.forward)`, then HF's own `generate`: a batch of two
    prompts, one left-padded, decoded greedily 14 tokens past a window of 6 (Mistral). generate
    passes in an empty cache with the prompt (its types were not registered through a bound method,
    and its window layers' counts were not set aside: torch.export and then the call's flattening
    failed); every token is eager's, from the prompt's, the growing window's and the full one's
    programs."""
    model = randomize(DECODERS["llama"]() if name == "llama" else SLIDING["mistral"]())
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 100, (2, 5), generator=gen)
    mask = torch.ones(2, 5, dtype=torch.long)
    ids[0, :2], mask[0, :2] = 0, 0
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0)
        model.forward = compiled = cuvil.compile(model.forward, cache=False)
        got = model.generate(ids, attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0)
    assert torch.equal(got, want)
    assert compiled.num_variants == (2 if name == "llama" else 3)


SEQ2SEQ = {
    "bart": lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=100, max_position_embeddings=64)),
    "t5": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=100, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1)),
}


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_an_encoder_decoder_generates_as_eager(name):
    """generate on a compiled forward of an encoder-decoder model: its decoder's cache is an
    EncoderDecoderCache (self-attention keys growing with `past`, cross-attention keys as long as
    the encoder's output and computed at the first step), which was refused by name. Three
    programs: the first step's (empty caches), the second's (`past` 1, which torch.export fixes),
    and every later step's; every step's logits are eager's."""
    model = randomize(SEQ2SEQ[name]())
    ids = torch.randint(2, 100, (2, 12), generator=torch.Generator().manual_seed(7))
    options = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, num_beams=1, output_logits=True,
                   return_dict_in_generate=True)
    with torch.no_grad():
        want = model.generate(ids, **options)
        model.forward = compiled = cuvil.compile(model.forward, cache=False)
        got = model.generate(ids, **options)
    assert torch.equal(got.sequences, want.sequences)
    for mine, eager in zip(got.logits, want.logits, strict=True):     # every step's logits, not only their argmax
        torch.testing.assert_close(mine, eager, rtol=0, atol=1e-5 * float(eager.abs().max()))
    assert compiled.num_variants == 3


def generate_eager_then_compiled(model, ids: torch.Tensor, tokens: int):
    """Greedy `generate` of `tokens` tokens in eager, then with `model.forward` compiled: (eager's
    tokens, Cuvil's, the compiled forward)."""
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
        model.forward = compiled = cuvil.compile(model.forward, cache=False)
        got = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
    return want, got, compiled


def test_a_one_token_prompt_decodes_as_eager():
    """The first step after a one-token prompt has a cache of length 1, which torch.export fixes
    (it failed: "Cannot create Dim with inconsistent min=1, max=1"); it compiles static, and the
    steps after it dynamic."""
    model = randomize(DECODERS["llama"]())
    ids = torch.randint(1, 100, (1, 1), generator=torch.Generator().manual_seed(2))
    want, got, compiled = generate_eager_then_compiled(model, ids, 8)
    assert torch.equal(got, want)
    assert compiled.num_variants == 3


MIXTURES = {
    "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=100, num_local_experts=4, num_experts_per_tok=2)),
    # latent attention (its keys made with `new_empty` and two slice copies), a shared expert, and
    # routing limited to the best of two groups of experts
    "deepseek_v3": lambda: transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
        vocab_size=100, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
        kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=2,
        topk_group=1, head_dim=8)),
}


@pytest.mark.parametrize("name", MIXTURES)
def test_a_mixture_of_experts_decodes_as_eager(name):
    """Mixtral's and DeepSeek-V3's experts (transformers' default `grouped_mm` on a CPU: the tokens
    sorted by expert, a histogram of tokens per expert, a loop of products over its running counts,
    the rows put back through an inverse permutation) were refused at `aten.histc`. The grouped
    product is Cuvil's `grouped_matmul` (one GEMM per expert over its rows), and the histogram and
    the inverse permutation's assignment are decomposed into comparisons: a 24-token prompt's
    logits are within twice eager's own error of fp64 (transformers' `batched_mm` experts, the
    same sums), and generate's greedy tokens from a batch of two are eager's."""
    model = randomize(MIXTURES[name]())
    assert model.config._experts_implementation == "grouped_mm"
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(1, 100, (1, 24), generator=gen)
    got = cuvil.compile(model, cache=False)(ids).logits
    fp64 = copy.deepcopy(model).double()
    fp64.config._experts_implementation = "batched_mm"          # torch's grouped_mm takes no float64
    with torch.no_grad():
        want, exact = model(ids).logits, fp64(ids).logits.float()
    assert float((got - exact).abs().max()) <= 2 * float((want - exact).abs().max()) + 1e-5 * float(exact.abs().max())
    want, got, _ = generate_eager_then_compiled(model, torch.randint(1, 100, (2, 6), generator=gen), 10)
    assert torch.equal(got, want)


COMPLEX_ROTARY = {
    # chunked attention, layers without rotary, and experts every other layer
    "llama4": lambda: transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, intermediate_size_mlp=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=1)),
    "deepseek_v2": lambda: transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(
        vocab_size=100, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=8,
        first_k_dense_replace=1, n_group=2, topk_group=1, topk_method="greedy")),
}


@pytest.mark.parametrize("name", COMPLEX_ROTARY)
def test_complex_rotary_embeddings_decode_as_eager(name):
    """Llama 4's and DeepSeek-V2's rotary embeddings multiply complex numbers (`torch.polar`,
    `view_as_complex`): refused at `aten.polar` before, now computed as pairs of floats
    (frontend/complex_pairs.py). generate's greedy tokens from a batch of two are eager's."""
    model = randomize(COMPLEX_ROTARY[name]())
    ids = torch.randint(1, 100, (2, 6), generator=torch.Generator().manual_seed(4))
    want, got, compiled = generate_eager_then_compiled(model, ids, 10)
    assert torch.equal(got, want)
    assert compiled.num_variants == 2


def test_while_a_step_is_captured_other_sliding_window_layers_keep_their_count():
    """The capture patches the window layer's class: only the captured step's layers (marked)
    count by their keys' length and keep every token; another cache's, run in eager meanwhile (by
    another thread), counts and crops as it does."""
    from cuvil.frontend.hf_caches import windows_as_captured
    model = randomize(transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=100, sliding_window=4)))
    ids, nxt = torch.randint(1, 100, (1, 3)), torch.randint(1, 100, (1, 1))
    with torch.no_grad():
        captured, other, plain = (model(ids).past_key_values for _ in range(3))
        with windows_as_captured({"past_key_values": captured}):
            got = model(nxt, past_key_values=other).logits
        want = model(nxt, past_key_values=plain).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert other.layers[0].cumulative_length == plain.layers[0].cumulative_length == 4
    assert other.layers[0].keys.shape[-2] == plain.layers[0].keys.shape[-2] == 3      # cropped to the window
    assert captured.layers[0].cumulative_length == 3                                    # given back


def test_a_cache_cuvil_cannot_update_is_refused_or_run_in_eager():
    """A StaticCache writes into fixed buffers: Cuvil cannot write a compiled call's result back
    into them, so such a call is refused by name, or with fallback="eager" run in PyTorch, which
    updates the cache."""
    model = randomize(DECODERS["llama"]())
    ids = torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(3))
    nxt = torch.randint(1, 100, (1, 1), generator=torch.Generator().manual_seed(4))

    def static_cache():
        cache = transformers.StaticCache(config=model.config, max_cache_len=32)
        with torch.no_grad():
            model(ids, past_key_values=cache)
        return cache
    given = static_cache()
    with pytest.raises(cuvil.CuvilError, match=r"input 'past_key_values' is a StaticCache of StaticLayer layers"):
        cuvil.compile(model, cache=False)(nxt, past_key_values=given)
    lenient = cuvil.compile(model, cache=False, fallback="eager")
    with pytest.warns(UserWarning, match="runs in eager PyTorch: CacheInputError"):
        step = lenient(nxt, past_key_values=given)
    with torch.no_grad():
        want = model(nxt, past_key_values=static_cache()).logits
    torch.testing.assert_close(step.logits, want, rtol=0, atol=1e-5 * float(want.abs().max()))
    assert given.get_seq_length() == 13


def test_a_saved_decoder_decodes_in_a_fresh_process(tmp_path):
    """A saved model's variants include the decoding step's: loaded in a process that has not
    imported transformers, it takes the prompt, then a step with the cache it returned, which it
    updates in place, bit-identical to the compiled model."""
    model = randomize(DECODERS["llama"]())
    ids = torch.randint(1, 100, (1, 12), generator=torch.Generator().manual_seed(3))
    nxt = torch.randint(1, 100, (1, 1), generator=torch.Generator().manual_seed(4))
    c = cuvil.compile(model)
    first = c(ids)
    step = c(nxt, past_key_values=first.past_key_values)
    c.save(tmp_path / "decoder.cuvil")
    torch.save({"ids": ids, "nxt": nxt, "logits": first.logits, "step": step.logits,
                "keys": first.past_key_values.layers[1].keys}, tmp_path / "want.pt")
    script = ("import sys, torch, cuvil\n"
              f"want = torch.load({str(tmp_path / 'want.pt')!r})\n"
              f"model = cuvil.load({str(tmp_path / 'decoder.cuvil')!r})\n"
              "out = model(want['ids'])\n"
              "assert type(out.past_key_values).__name__ == 'DynamicCache', type(out.past_key_values)\n"
              "assert torch.equal(out.logits, want['logits'])\n"
              "cache = out.past_key_values\n"
              "step = model(want['nxt'], past_key_values=cache)\n"
              "assert step.past_key_values is cache and cache.get_seq_length() == 13\n"
              "assert torch.equal(step.logits, want['step'])\n"
              "assert torch.equal(cache.layers[1].keys, want['keys'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
