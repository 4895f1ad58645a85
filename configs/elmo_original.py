"""ELMo "original" (Peters et al. 2018; allenai/bilm-tf's options): char CNN with
16-dim char embeddings and filters [[1,32],[2,32],[3,64],[4,128],[5,256],[6,512],
[7,1024]] (2048), 2 highway layers, projection to 512; 2 biLSTM layers of 4096 cells
projected to 512, residual between layers, cell and projection clipped at 3.

The published 93.6M parameters count the char CNN (18.0M: char embeddings, filters,
highways, projection) and the four LSTMPs (2 layers x 2 directions x 18.9M = 75.6M);
not the softmax, which is over the training vocabulary and dropped after
pretraining. ``python -m t5x_like.summary --config=configs/elmo_original.py``
prints a row per module: ``char_cnn`` + the ``*_lstm_*`` rows add to 93.6M; the
``softmax`` rows (vocab x 512 + vocab) come on top of it. Here the vocabulary is the
paper's 793,471 words (``char_vocabulary=""``: stand-in characters from the ids,
for counting; the 1B Word Benchmark vocabulary is not shipped), so the total is 500M.

    python -m t5x_like.summary --config=configs/elmo_original.py
"""

from t5x_like import config_lib


def model_config():
    model = config_lib.model_defaults("bilm")
    model.update(dict(vocab_size=793471, char_vocabulary="", max_chars=50, char_embed_dim=16,
                      filter_widths=(1, 2, 3, 4, 5, 6, 7),
                      filter_counts=(32, 32, 64, 128, 256, 512, 1024), num_highway=2,
                      projection_dim=512, lstm_dim=4096, num_layers=2, dropout_rate=0.1))
    return model


def get_config():
    config = config_lib.default_config()
    config.task = "embedded_en_lm"
    config.task_feature_lengths = {"targets": 20}  # bilm-tf's unroll_steps
    config.model = model_config()
    config.data.pack = False
    config.batch_size = 128
    config.num_train_steps = 100_000
    config.optimizer.name = "adamw"  # bilm-tf: Adagrad at 0.2
    config.optimizer.learning_rate = 1e-3
    return config
