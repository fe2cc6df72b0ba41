package pgpipe_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pgpipe "github.com/gopipeline/pipeline/postgres"
)

// restrictedRole creates a login role with no right to create anything (no CREATE on
// schema public), dropped when the test ends, and returns its name.
func restrictedRole(t *testing.T, admin *pgxpool.Pool) string {
	t.Helper()
	role := tableName("pgpipe_role")
	mustExec(t, admin, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		mustExec(t, admin, "DROP OWNED BY "+role)
		mustExec(t, admin, "DROP ROLE "+role)
	})
	mustExec(t, admin, "REVOKE CREATE ON SCHEMA public FROM "+role)
	return role
}

// rolePool opens a pool on the test server as role (when not empty) with searchPath
// (when not empty), closed when the test ends.
func rolePool(t *testing.T, role, searchPath string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL(t))
	require.NoError(t, err)
	if role != "" {
		cfg.ConnConfig.User = role
	}
	if searchPath != "" {
		cfg.ConnConfig.RuntimeParams["search_path"] = searchPath
	}
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestCheckpointLoadWithDMLRightsOnly loads and saves a checkpoint as a role that may
// only read and write the existing checkpoint tables. Load used to run CREATE TABLE IF
// NOT EXISTS each time, which fails without CREATE on the schema ("permission denied
// for schema public").
func TestCheckpointLoadWithDMLRightsOnly(t *testing.T) {
	admin := newPool(t, 2)
	_, err := pgpipe.NewCheckpoint(admin, tableName("job_init")).Load(t.Context()) // the tables exist
	require.NoError(t, err)
	role := restrictedRole(t, admin)
	mustExec(t, admin, "GRANT SELECT, INSERT, UPDATE ON pgpipe_checkpoint TO "+role)
	mustExec(t, admin, "GRANT SELECT, INSERT, UPDATE, DELETE ON pgpipe_committed TO "+role)

	ck := pgpipe.NewCheckpoint(rolePool(t, role, ""), tableName("job"))
	pos, err := ck.Load(t.Context())
	require.NoError(t, err)
	assert.Zero(t, pos)
	require.NoError(t, ck.Save(t.Context(), 42))
	pos, err = ck.Load(t.Context())
	require.NoError(t, err)
	assert.Equal(t, int64(42), pos)
}

// TestCheckpointMissingTableNamesTheRight loads a checkpoint as a role that may not
// create the missing tables: the error names the role, the schema and the privilege,
// and wraps PostgreSQL's.
func TestCheckpointMissingTableNamesTheRight(t *testing.T) {
	admin := newPool(t, 2)
	role := restrictedRole(t, admin)
	schema := tableName("pgpipe_schema")
	mustExec(t, admin, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { mustExec(t, admin, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	mustExec(t, admin, "GRANT USAGE ON SCHEMA "+schema+" TO "+role)

	_, err := pgpipe.NewCheckpoint(rolePool(t, role, schema), "job").Load(t.Context())
	require.Error(t, err)
	pe, ok := errors.AsType[*pgconn.PgError](err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, pgerrcode.InsufficientPrivilege, pe.Code)
	for _, want := range []string{fmt.Sprintf("role %q", role), fmt.Sprintf("schema %q", schema), "CREATE privilege", "pgpipe_checkpoint"} {
		assert.Contains(t, err.Error(), want)
	}

	// Created by a role that may, the tables serve the restricted role.
	adminIn := rolePool(t, "", schema)
	_, err = pgpipe.NewCheckpoint(adminIn, "job_init").Load(t.Context())
	require.NoError(t, err)
	mustExec(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %s.pgpipe_checkpoint TO %s", schema, role))
	mustExec(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s.pgpipe_committed TO %s", schema, role))
	_, err = pgpipe.NewCheckpoint(rolePool(t, role, schema), "job").Load(t.Context())
	require.NoError(t, err)
}
