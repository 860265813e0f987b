package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"quill/internal/store"
)

// Client calls a running server's admin API. It implements the same
// operations as auth.Directory, so the CLI drives either.
type Client struct {
	Addr  string // host:port of the admin listener
	Token string
	HTTP  *http.Client
}

var _ Directory = (*Client)(nil)

// ErrClusterOff: the server asked runs without a cluster.
var ErrClusterOff = errors.New("admin: the node runs without a cluster")

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.Addr+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e apiError
		json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
		kind := map[string]error{"not_found": store.ErrNotFound, "exists": store.ErrExists, "invalid": store.ErrInvalid, "cluster_off": ErrClusterOff}[e.Kind]
		if kind != nil {
			return fmt.Errorf("%w (%s)", kind, e.Error)
		}
		return fmt.Errorf("admin API %s %s: %s: %s", method, path, resp.Status, e.Error)
	}
	if out != nil {
		return json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(out)
	}
	return nil
}

func (c *Client) AddUser(ctx context.Context, address, password string, quotaBytes int64) error {
	return c.do(ctx, "POST", "/api/users", UserRequest{Address: address, Password: password, QuotaBytes: &quotaBytes}, nil)
}

func (c *Client) SetPassword(ctx context.Context, address, password string) error {
	return c.do(ctx, "PATCH", "/api/users/"+url.PathEscape(address), UserRequest{Password: password}, nil)
}

func (c *Client) SetQuota(ctx context.Context, address string, quotaBytes int64) error {
	return c.do(ctx, "PATCH", "/api/users/"+url.PathEscape(address), UserRequest{QuotaBytes: &quotaBytes}, nil)
}

func (c *Client) DeleteUser(ctx context.Context, address string) error {
	return c.do(ctx, "DELETE", "/api/users/"+url.PathEscape(address), nil, nil)
}

func (c *Client) ListUsers(ctx context.Context) ([]store.User, error) {
	var infos []UserInfo
	if err := c.do(ctx, "GET", "/api/users", nil, &infos); err != nil {
		return nil, err
	}
	out := make([]store.User, len(infos))
	for i, u := range infos {
		out[i] = store.User{Address: u.Address, QuotaBytes: u.QuotaBytes}
		if u.Disabled {
			out[i].Status = store.UserDisabled
		}
	}
	return out, nil
}

func (c *Client) AddAlias(ctx context.Context, alias, target string) error {
	return c.do(ctx, "POST", "/api/aliases", Alias{Alias: alias, Target: target}, nil)
}

func (c *Client) DeleteAlias(ctx context.Context, alias string) error {
	return c.do(ctx, "DELETE", "/api/aliases/"+url.PathEscape(alias), nil, nil)
}

func (c *Client) ListAliases(ctx context.Context) ([][2]string, error) {
	var list []Alias
	if err := c.do(ctx, "GET", "/api/aliases", nil, &list); err != nil {
		return nil, err
	}
	out := make([][2]string, len(list))
	for i, a := range list {
		out[i] = [2]string{a.Alias, a.Target}
	}
	return out, nil
}
