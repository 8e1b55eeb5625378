# An SGLang deployment on a registered engine, parked deep when idle.
deployment "coder" {
  engine    = "sglang"
  routes    = ["coder", "coder-30b"]
  residency = "deep"

  model {
    path = "Qwen3-Coder-30B-A3B-Instruct"
  }

  lifecycle {
    ready_idle_timeout = "10m"
  }

  engine_config {
    max_concurrent_requests = 16
    context_length          = 65536

    memory {
      request  = "60GiB"
      kv_cache = "12GiB"
    }

    sglang {
      chunked_prefill_size = 8192
      tokenizer_workers    = 1
      tool_call_parser     = "auto"
      reasoning_parser     = "auto"
    }
  }
}
