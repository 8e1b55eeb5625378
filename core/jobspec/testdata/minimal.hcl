# The smallest job spec: a name, an engine and a model.
deployment "chat-small" {
  engine = "vllm"
  model { path = "qwen3-4b" }
}
