# Every knob of a deployment, set.
deployment "coder-large" {
  engine    = "sglang-main"
  api       = "chat"
  routes    = ["coder-large", "coder"]
  residency = "deep"
  instances = 2

  model {
    hf                  = "SomeOrg/Coder-30B"
    revision            = "0123456789abcdef0123456789abcdef01234567"
    content_fingerprint = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
  }

  resources {
    startup {
      gpu = "80GiB"
      ram = "8GiB"
    }
    ready {
      gpu = "72GiB"
      ram = "4GiB"
    }
    parked {
      gpu = "1GiB"
      ram = "4GiB"
    }
  }

  lifecycle {
    warm                = false
    activation          = "explicit"
    ready_idle_timeout  = "5m"
    parked_idle_timeout = "30m"
  }

  request_deadline = "1800s"

  timeouts {
    initialize = "20m"
    wake       = "2m"
    stop       = "30s"
  }

  limits {
    stream_idle      = "90s"
    client_read_idle = "15s"
    max_chunk_bytes  = "128KiB"
    max_waiting      = 16
  }

  engine_config {
    max_concurrent_requests = 16
    context_length          = 32768
    dtype                   = "bfloat16"
    quantization            = "fp8"
    kv_cache_dtype          = "fp8_e4m3"
    cuda_graphs             = true
    trust_remote_code       = false
    memory {
      request  = "72GiB"
      kv_cache = "16GiB"
    }
    accept_extra_args = true
    extra_args        = ["--enable-mixed-chunk", "--chunked-prefill-size", "-1"]
    env = {
      TOKENIZERS_PARALLELISM = "false"
    }
    sglang {
      chunked_prefill_size = 8192
      tool_call_parser     = "auto"
      reasoning_parser     = "none"
      tokenizer_workers    = 1
    }
  }
}
