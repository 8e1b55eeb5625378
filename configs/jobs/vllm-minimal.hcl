# The smallest deployment: a name, an engine and a model. Everything else
# takes its default (see vllm-full.hcl for every knob).
#
#   capyctl deploy --file configs/jobs/vllm-minimal.hcl --activate --wait
deployment "chat-small" {
  engine = "vllm"

  model {
    path = "qwen3-4b" # a directory under the models root (~/models)
  }
}
