# CapyCTL standalone role serving its inference endpoint over TLS.
#
# The certificate and key are read at start and read again when either file
# changes (checked at each new connection): renew them in place (certbot,
# cert-manager, a cron job) and new connections get the new certificate
# while open ones go on. website/content/operations/tls.md explains the
# setup, client certificates and running behind a reverse proxy instead.

role   = "standalone"
listen = "0.0.0.0:8443"

tls {
  # The certificate, with its chain, and its key (PEM; the key owner-only).
  cert_file = "/etc/capyctl/tls/fullchain.pem"
  key_file  = "/etc/capyctl/tls/privkey.pem"

  # Uncomment to require a client certificate signed by one of these CAs,
  # on top of the API key.
  # client_ca_file = "/etc/capyctl/tls/clients-ca.pem"
}

listener {
  # Clients on the network: keep the caps and deadlines tight.
  idle_timeout                    = "60s"
  body_read_timeout               = "60s"
  max_connections                 = 4096
  max_unauthenticated_per_address = 512
}
