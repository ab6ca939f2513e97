package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// readProperties reads a Java properties file as Kafka's tools'
// --command-config takes it (java.util.Properties' rules): # and !
// comments; a key ends at the first unescaped =, : or white space; a
// line ending in an odd number of backslashes goes on on the next; \t,
// \n, \r, \f and \uXXXX escapes, and a backslash before any other
// character stands for that character. An error names the line, never
// its text (it may hold a password).
func readProperties(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("-command-config: %w", err)
	}
	defer f.Close()
	props := map[string]string{}
	sc := bufio.NewScanner(f)
	var logical strings.Builder
	lineNo, startNo := 0, 0
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		if logical.Len() == 0 {
			line = strings.TrimLeft(line, " \t\f")
			if line == "" || line[0] == '#' || line[0] == '!' {
				continue
			}
			startNo = lineNo
		} else {
			line = strings.TrimLeft(line, " \t\f")
		}
		trailing := len(line) - len(strings.TrimRight(line, `\`))
		if trailing%2 == 1 {
			logical.WriteString(line[:len(line)-1])
			continue
		}
		logical.WriteString(line)
		key, value, err := splitProperty(logical.String())
		logical.Reset()
		if err != nil {
			return nil, fmt.Errorf("-command-config %s, line %d: %w", path, startNo, err)
		}
		props[key] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("-command-config: %w", err)
	}
	if logical.Len() > 0 {
		return nil, fmt.Errorf("-command-config %s, line %d: a continued line with nothing after it", path, startNo)
	}
	return props, nil
}

// splitProperty splits a logical line into its key and value, unescaped.
func splitProperty(line string) (key, value string, err error) {
	end := len(line)
	for i := 0; i < len(line); i++ {
		if line[i] == '\\' {
			i++
			continue
		}
		if strings.IndexByte("=: \t\f", line[i]) >= 0 {
			end = i
			break
		}
	}
	rest := strings.TrimLeft(line[end:], " \t\f")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t\f")
	}
	if key, err = unescape(line[:end]); err != nil {
		return "", "", err
	}
	if value, err = unescape(rest); err != nil {
		return "", "", err
	}
	return key, value, nil
}

// unescape decodes a properties file's escapes.
func unescape(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i == len(s)-1 {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch c := s[i]; c {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+4 >= len(s) {
				return "", fmt.Errorf("a \\u escape cut short")
			}
			r, err := strconv.ParseUint(s[i+1:i+5], 16, 16)
			if err != nil {
				return "", fmt.Errorf("a malformed \\u escape")
			}
			b.WriteRune(rune(r))
			i += 4
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// jaasField finds name="value" (or name='value') in a sasl.jaas.config,
// as Kafka's JAAS parser reads it, backslash escapes included.
func jaasField(jaas, name string) string {
	m := regexp.MustCompile(`\b` + name + `\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')`).FindStringSubmatch(jaas)
	if m == nil {
		return ""
	}
	v := m[1] + m[2]
	return regexp.MustCompile(`\\(.)`).ReplaceAllString(v, "$1")
}

// fromProperties reads the connection settings of Kafka's client
// properties (and librdkafka's names for the same). What eoskit cannot
// honour is kept as a refusal of the setting it concerns, which a flag
// given for that setting lifts (settings.check): nothing is connected
// otherwise than asked.
func fromProperties(p map[string]string) (settings, error) {
	s := settings{brokers: p["bootstrap.servers"], protocol: strings.ToUpper(p["security.protocol"]), refused: map[string]error{}}
	switch s.protocol {
	case "", "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL":
	default:
		return s, fmt.Errorf("security.protocol %q: want PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", p["security.protocol"])
	}
	if strings.HasPrefix(s.protocol, "SASL") {
		mech := cmp.Or(p["sasl.mechanism"], p["sasl.mechanisms"]) // librdkafka's name
		switch m := strings.ToUpper(mech); m {
		case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
			s.mechanism = strings.ToLower(m)
		case "OAUTHBEARER":
			s.mechanism = "oauthbearer"
			// Kafka's tools fetch a token from an identity provider's
			// endpoint, or, given a file: URL, read it from that file;
			// eoskit's command reads the file.
			file, err := tokenFile(p["sasl.oauthbearer.token.endpoint.url"])
			if err != nil {
				s.refused["sasl-token-file"] = err
			}
			s.tokenFile = file
			s.extensions = jaasExtensions(p["sasl.jaas.config"])
		default:
			s.refused["sasl-mechanism"] = fmt.Errorf("sasl.mechanism %q: eoskit's command speaks PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER", cmp.Or(mech, "GSSAPI (the default)"))
		}
		s.user, s.pass = p["sasl.username"], p["sasl.password"]
		if jaas := p["sasl.jaas.config"]; jaas != "" {
			s.user, s.pass = jaasField(jaas, "username"), jaasField(jaas, "password")
		}
	}
	if alg, set := p["ssl.endpoint.identification.algorithm"]; set && (alg == "" || strings.EqualFold(alg, "none")) {
		return s, fmt.Errorf("ssl.endpoint.identification.algorithm %q turns the host-name check off: eoskit always checks the broker's host name", alg)
	}
	s.caFile = p["ssl.ca.location"]
	if loc := p["ssl.truststore.location"]; loc != "" {
		if t := strings.ToUpper(p["ssl.truststore.type"]); t != "PEM" {
			s.refused["tls-ca"] = fmt.Errorf("ssl.truststore.type %q: eoskit reads PEM truststores (convert: keytool -exportcert -rfc), or give -tls-ca", p["ssl.truststore.type"])
		}
		s.caFile = loc
	}
	s.certFile, s.keyFile = p["ssl.certificate.location"], p["ssl.key.location"]
	if loc := p["ssl.keystore.location"]; loc != "" {
		if t := strings.ToUpper(p["ssl.keystore.type"]); t != "PEM" {
			s.refused["tls-cert"] = fmt.Errorf("ssl.keystore.type %q: eoskit reads PEM keystores (the certificate and its key in one file), or give -tls-cert and -tls-key", p["ssl.keystore.type"])
		}
		s.certFile, s.keyFile = loc, loc
	}
	return s, nil
}

// tokenFile returns the file of a token endpoint given as a file: URL
// (file:///path, or file://localhost/path), as Kafka reads it: the path
// as written, percent signs included (refused here, being ambiguous). An
// error never quotes the URL, which may carry a client's secret.
func tokenFile(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	switch {
	case endpoint == "":
		return "", errors.New("sasl.mechanism OAUTHBEARER: no sasl.oauthbearer.token.endpoint.url: eoskit's command reads the token from a file (file:///path/to/token), or give -sasl-token-file")
	case err != nil:
		return "", errors.New("sasl.oauthbearer.token.endpoint.url is not a URL")
	case u.Scheme != "file":
		return "", fmt.Errorf("sasl.oauthbearer.token.endpoint.url (a %s URL on %s): eoskit's command reads the token from a file (file:///path/to/token), not from an identity provider: fetch one into a file, or give -sasl-token-file", u.Scheme, u.Hostname())
	case u.Opaque != "" || u.Host != "" && u.Host != "localhost" || u.EscapedPath() == "" || u.EscapedPath() == "/":
		return "", errors.New("sasl.oauthbearer.token.endpoint.url: a file URL is file:///absolute/path/to/token")
	case strings.Contains(u.EscapedPath(), "%"):
		return "", errors.New("sasl.oauthbearer.token.endpoint.url: the token's path has a percent sign: give the file with -sasl-token-file")
	}
	path := u.EscapedPath()
	if len(path) > 2 && path[0] == '/' && path[2] == ':' { // file:///C:/token on Windows
		path = path[1:]
	}
	return filepath.FromSlash(path), nil
}

// jaasExtensions returns the extension_NAME options of an OAUTHBEARER
// sasl.jaas.config, by NAME.
func jaasExtensions(jaas string) map[string]string {
	var ext map[string]string
	for _, m := range regexp.MustCompile(`\bextension_([A-Za-z0-9_.-]+)\s*=`).FindAllStringSubmatch(jaas, -1) {
		if ext == nil {
			ext = map[string]string{}
		}
		ext[m[1]] = jaasField(jaas, "extension_"+regexp.QuoteMeta(m[1]))
	}
	return ext
}
