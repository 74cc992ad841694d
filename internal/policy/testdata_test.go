package policy

// testProfile exercises every section. Tests check rule positions in it,
// so append rather than insert.
const testProfile = `name: test
network:
  mode: default-deny
  allow:
    - domain: "*.github.com"
      ports: [443]
    - domain: example.com
    - cidr: 10.1.0.0/16
      ports: ["5432", "8000-8100"]
      proto: tcp
    - cidr: 0.0.0.0/0
      ports: [853]
    - domain: "*.example.org"
    - cidr: 2001:db8::/32
  deny:
    - domain: evil.github.com
    - cidr: 10.1.2.0/24
    - domain: "*.bad.example.org"
  host_ports: [11434]
files:
  mounts:
    - /home/u/app:/work/app
    - host: /srv/data
      guest: /data
  rules:
    - path: /work/app/**
      access: rw
    - path: /work/app/.env
      access: deny
    - path: /work/app/**/*.pem
      access: deny
    - path: /data/**
      access: ro
    - path: /data/scratch/**
      access: rw
    - path: /work/app/docs/**
      access: ro
git:
  repos:
    - repo: github.com/acme/*
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: deny
        - ref: refs/heads/feature/**
          force_push: allow
          delete: allow
        - ref: refs/tags/v*
          delete: deny
    - repo: github.com/acme/secret
      read: deny
    - repo: gitlab.com/**
      read: allow
ssh:
  cert_ttl: 10m
  allow:
    - host: "build*.corp.example"
      user: deploy
      ports: [22, 2222]
    - host: bastion.corp.example
  deny:
    - host: "*"
      user: root
      ports: ["1-65535"]
credentials:
  - name: gh
    from: github-token
    forge: github.com
  - name: openai
    from: openai-key
    domain: api.openai.com
    header: Authorization
    format: "Bearer {}"
  - name: deploy
    from: deploy-key
    ssh_host: "build*.corp.example"
`
