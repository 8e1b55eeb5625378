# A llama.cpp (llama-server) model that answers decision requests on
# /v1/systemone. llama.cpp stops and starts instead of parking.
deployment "judge" {
  engine    = "llamacpp"
  api       = "decisions"
  residency = "restart_only"

  model {
    path = "judge-8b-gguf"
  }

  engine_config {
    max_concurrent_requests = 4     # llama-server slots (-np)
    context_length          = 8192  # per slot
    kv_cache_dtype          = "q8_0"

    llamacpp {
      gguf_file    = "judge-8b-Q4_K_M.gguf"
      n_gpu_layers = "all"
    }
  }
}
