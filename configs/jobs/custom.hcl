# A custom OpenAI-compatible server, registered with
#   capyctl engine add --custom /opt/mysrv/bin/serve --name mysrv --manifest mysrv.hcl
# It listens on the private loopback port CapyCTL gives it.
deployment "house-model" {
  engine    = "mysrv"
  residency = "restart_only"
  routes    = ["house-model", "house/v2"]

  model {
    path = "~/models/house-v2"
  }

  resources {
    gpu = "9GiB"
    ram = "2GiB"
  }

  lifecycle {
    warm = true
  }

  engine_config {
    max_concurrent_requests = 8

    custom {
      health_path = "/health"
      args        = ["--threads", "8"]
    }
  }
}
