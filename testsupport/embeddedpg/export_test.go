package embeddedpg

// Dir is the cluster's directory, for tests that check Stop deletes it.
func Dir(s *Server) string { return s.dir }
