# Several deployments in one file.
deployment "judge" {
  engine    = "llamacpp"
  api       = "decisions"
  residency = "restart_only"
  model {
    path = "~/models/judge-gguf"
  }
  resources {
    gpu = "6GiB"
    ram = "1GiB"
  }
  engine_config {
    context_length = 4096
    llamacpp {
      gguf_file    = "judge-q4_k_m.gguf"
      n_gpu_layers = "all"
    }
  }
}

deployment "embed" {
  engine = "custom"
  routes = ["embed", "org/embed-v1"]
  model {
    path = "/srv/models/embed"
  }
  lifecycle {
    warm = true
  }
  engine_config {
    custom {
      health_path = "/health"
      args        = ["--port", "{{port}}"]
    }
  }
}
