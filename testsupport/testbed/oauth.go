package testbed

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// OAuthClaims are what an OAUTHBEARER token for a broker of
// [StartLocalBrokerWithTLS] says: its subject (the principal, as
// User:Subject), issuer, audience and expiry, and the key id its header
// names.
type OAuthClaims struct {
	Subject, Issuer, Audience, KeyID string
	Expiry                           time.Time
}

// OAuthClaims returns the claims the broker takes for sub for the next
// hour: its issuer, its audience, the id of the key it trusts.
func (b *LocalBroker) OAuthClaims(tb testing.TB, sub string) OAuthClaims {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(b.stateDir, "kafka", "tls", "oauth.claims"))
	if err != nil {
		tb.Fatalf("testbed: the broker takes no OAUTHBEARER token (StartLocalBrokerWithTLS's does): %v", err)
	}
	c := OAuthClaims{Subject: sub, Expiry: time.Now().Add(time.Hour)}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "kid":
			c.KeyID = v
		case "issuer":
			c.Issuer = v
		case "audience":
			c.Audience = v
		}
	}
	if c.KeyID == "" || c.Issuer == "" || c.Audience == "" {
		tb.Fatalf("testbed: the broker's oauth.claims lacks its kid, issuer or audience: %q", raw)
	}
	return c
}

// OAuthKey returns the key the broker trusts OAUTHBEARER tokens signed by.
func (b *LocalBroker) OAuthKey(tb testing.TB) *rsa.PrivateKey {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(b.stateDir, "kafka", "tls", "oauth.key"))
	if err != nil {
		tb.Fatalf("testbed: the broker's OAUTHBEARER key: %v", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		tb.Fatal("testbed: the broker's OAUTHBEARER key holds no PEM block")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		tb.Fatalf("testbed: the broker's OAUTHBEARER key: %v", err)
	}
	rsaKey, ok := key.(*rsa.PrivateKey)
	if !ok {
		tb.Fatalf("testbed: the broker's OAUTHBEARER key is a %T, not RSA", key)
	}
	return rsaKey
}

// SignOAuth returns a JWT (RS256) carrying c, signed by key, issued now.
func SignOAuth(tb testing.TB, key *rsa.PrivateKey, c OAuthClaims) string {
	tb.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", c.KeyID))
	if err != nil {
		tb.Fatalf("testbed: sign a token: %v", err)
	}
	now := time.Now()
	token, err := jwt.Signed(signer).Claims(jwt.Claims{
		Subject:  c.Subject,
		Issuer:   c.Issuer,
		Audience: jwt.Audience{c.Audience},
		IssuedAt: jwt.NewNumericDate(now.Add(-time.Minute)),
		Expiry:   jwt.NewNumericDate(c.Expiry),
	}).Serialize()
	if err != nil {
		tb.Fatalf("testbed: sign a token: %v", err)
	}
	return token
}
