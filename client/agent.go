package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"

	"github.com/smx-dev/smx/api"
)

// The agent wire types, under this package's name.
type (
	AgentRequest = api.AgentRequest
	Agent        = api.Agent
	AgentEvent   = api.AgentEvent
)

// RunAgent launches a preset's coding agent on req.Workspace (a folder on
// the server's host) and returns once it runs detached in its sandbox.
// The first launch of a preset builds its image (minutes): progress, when
// set, is called with each progress event (Stage "build" carries one line
// of the build's output). When the agent exits, its sandbox stops (or is
// removed, with req.Remove); Agent reports the exit status.
func (c *Client) RunAgent(ctx context.Context, req AgentRequest, progress func(AgentEvent)) (*Agent, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.request(ctx, "POST", "/v1/agents", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev AgentEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("smx api: POST /v1/agents: bad line %q: %w", sc.Bytes(), err)
		}
		switch {
		case ev.Type == "agent" && ev.Agent != nil:
			return ev.Agent, nil
		case ev.Type == "error" && ev.Error != nil:
			return nil, &APIError{Status: resp.StatusCode, Class: ev.Error.Class, Message: ev.Error.Message, ExitCode: ev.Error.ExitCode}
		case progress != nil:
			progress(ev)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("smx api: POST /v1/agents: %w", err)
	}
	return nil, fmt.Errorf("smx api: POST /v1/agents: the answer ended before the agent started")
}

// Agent returns a sandbox that runs a preset's agent, with the agent's
// exit status once it has ended.
func (c *Client) Agent(ctx context.Context, name string) (*Agent, error) {
	var v Agent
	return &v, c.do(ctx, "GET", "/v1/agents/"+url.PathEscape(name), nil, nil, &v)
}
