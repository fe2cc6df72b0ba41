package pipeline

import "testing"

// TestRowKinds checks that every rowKind names a Kind of its own.
func TestRowKinds(t *testing.T) {
	seen := map[Kind]rowKind{}
	for k := range numKinds {
		name := k.kind()
		if name == "" {
			t.Errorf("rowKind %d has no Kind in rowKinds", k)
		}
		if o, dup := seen[name]; dup {
			t.Errorf("rowKinds %d and %d are both %q", o, k, name)
		}
		seen[name] = k
	}
}
