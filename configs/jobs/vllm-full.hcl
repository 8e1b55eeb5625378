# Every knob of a deployment, with a word on each. Leave a field out to take
# its default; `capyctl validate config --file <this file>` prints the
# completed deployment and where each value came from.
deployment "chat-large" {
  # A registered engine's name (capyctl engine list), or a family name
  # (vllm, sglang, llamacpp, tensorfold, custom) for the host's one engine
  # of that family.
  engine = "vllm"

  # chat (/v1/chat/completions, the default) or decisions (/v1/systemone).
  api = "chat"

  # The public model names clients send; default: the deployment's name.
  routes = ["chat-large", "chat"]

  # How the model parks when idle: deep (weights reloaded from disk),
  # host_backed (weights kept in host RAM; discrete cards only) or
  # restart_only (stopped, started again on the next request). Leave it out
  # to let the engine and the machine decide.
  residency = "host_backed"

  # A private LMCache server per instance: auto (the default: where it is
  # qualified, today restart_only on vLLM 0.32 / SGLang 0.5.22 with LMCache
  # 0.5.6+), off, or required (refused where it cannot run). Its pool in
  # host RAM is charged beside the engine.
  lmcache      = "auto"
  lmcache_pool = "4GiB"

  # Independent engine processes behind the routes (1-64).
  instances = 1

  model {
    # Exactly one of path (under the models root, absolute, or ~/...) and
    # hf (a Hugging Face repository, downloaded into ~/models/sources).
    hf = "Qwen/Qwen3-32B"
    # A Hugging Face commit (40 hex digits); deploy pins one when it is left out.
    revision = "0123456789abcdef0123456789abcdef01234567"
    # "measured" (the default), or "sha256:<64 hex>" to refuse any other
    # content (checkpoint_mismatch).
    content_fingerprint = "measured"
  }

  # Declared memory charges. The short form charges gpu and ram in every
  # phase but stopped:
  #   resources {
  #     gpu = "70GiB"
  #     ram = "4GiB"
  #   }
  # or per phase; a startup phase is at least the ready one. Leave the block
  # out to have the charges estimated, then measured.
  resources {
    startup {
      gpu = "76GiB"
      ram = "8GiB"
    }
    ready {
      gpu = "70GiB"
      ram = "4GiB"
    }
    parked {
      gpu = "1GiB"
      ram = "66GiB"
    }
  }

  lifecycle {
    # A warm deployment is never evicted or parked for idleness.
    warm = false
    # on_demand: the first request starts it; explicit: only an operator's
    # start does (requests get 409 deployment_inactive).
    activation = "on_demand"
    # Park (or stop, when restart_only) after this long without requests;
    # off when left out.
    ready_idle_timeout = "15m"
    # Stop a parked instance after this long; off when left out.
    parked_idle_timeout = "2h"
  }

  # Bounds a request until its first output: queueing, waking and prefill.
  request_deadline = "600s"

  # Lifecycle bounds; derived from the model's size when left out.
  timeouts {
    initialize = "20m"
    wake       = "2m"
    stop       = "30s"
  }

  limits {
    # End a stream with no output for this long after its first output.
    stream_idle = "120s"
    # End a stream whose client reads nothing for this long.
    client_read_idle = "10s"
    # End a stream on one engine chunk larger than this.
    max_chunk_bytes = "64KiB"
    # Requests that may wait for a place (then 429 queue_full).
    max_waiting = 64
  }

  engine_config {
    # Requests the engine runs at once (1-1024; vLLM's default here is 32).
    max_concurrent_requests = 32
    # Tokens per sequence; fitted to the KV budget when left out.
    context_length = 32768
    dtype          = "auto"
    quantization   = "fp8"
    kv_cache_dtype = "auto"
    # false runs without CUDA graphs (vLLM --enforce-eager).
    cuda_graphs = true
    # Needs the host's --allow-remote-code when true.
    trust_remote_code = false

    memory {
      # The instance's whole reservation on its card.
      request = "70GiB"
      # The KV cache's share of it.
      kv_cache = "16GiB"
      # The startup peak, when known (not with a resources block).
      # startup = "76GiB"
    }

    # Pass-through engine options: long options only, each approved by the
    # host where it is sensitive.
    accept_extra_args = true
    extra_args        = ["--enable-prefix-caching"]

    # Engine environment variables (approved by the host; reserved names
    # are refused with engine_env_reserved:<name>).
    env = {
      TOKENIZERS_PARALLELISM = "false"
    }

    # Settings of the engine family; its driver checks them.
    vllm {
      tool_call_parser          = "auto"
      reasoning_parser          = "auto"
      max_num_batched_tokens    = 8192
      safetensors_load_strategy = "eager"
    }
  }
}
