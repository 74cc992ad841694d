package policy

import (
	"slices"
	"testing"
)

func TestDiff(t *testing.T) {
	a, err := Parse("a.yaml", []byte(`network:
  allow:
    - domain: pypi.org
      ports: [443]
    - domain: "*.github.com"
      ports: [443]
files:
  rules:
    - path: /work/**
      access: rw
git:
  repos:
    - repo: forge.test/acme/app
      read: allow
      refs:
        - ref: refs/heads/agent/*
          push: allow
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The same rules in another order, and another name: no difference.
	same, err := Parse("same.yaml", []byte(`name: other
git:
  repos:
    - repo: forge.test/acme/app
      read: allow
      refs:
        - ref: refs/heads/agent/*
          push: allow
files:
  rules:
    - path: /work/**
      access: rw
network:
  allow:
    - domain: "*.github.com"
      ports: [443]
    - domain: pypi.org
      ports: [443]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(a, same); len(d) != 0 {
		t.Fatalf("reordered profile differs: %v", d)
	}
	b, err := Parse("b.yaml", []byte(`network:
  allow:
    - domain: pypi.org
      ports: [443, 80]
    - domain: "*.github.com"
      ports: [443]
files:
  rules:
    - path: /work/**
      access: rw
git:
  repos:
    - repo: forge.test/acme/app
      read: allow
      refs:
        - ref: refs/heads/agent/*
          push: allow
        - ref: refs/heads/main
          push: allow
ssh:
  allow:
    - host: build.example.test
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range Diff(a, b) {
		got = append(got, c.String())
	}
	want := []string{
		"- network.allow: {domain: pypi.org, ports: [443]}",
		"+ network.allow: {domain: pypi.org, ports: [80, 443]}",
		"+ git.refs: {repo: forge.test/acme/app, ref: refs/heads/main, push: allow}",
		"+ ssh.allow: {host: build.example.test, ports: [22]}",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Diff(a, b) =\n%q\nwant\n%q", got, want)
	}
	// And the other way round: the same rules, signs swapped.
	back := Diff(b, a)
	if len(back) != len(want) || back[0].Op != "remove" || back[len(back)-1].Op != "add" {
		t.Fatalf("Diff(b, a) = %v", back)
	}
}
