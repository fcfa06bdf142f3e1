// Names a KRaft cluster's active controller: the metadata quorum's leader, by the Admin API's
// DescribeMetadataQuorum (a broker forwards it to the quorum), which confluent-kafka does not
// offer (its describe_cluster().controller names a broker, not the quorum leader). Run from
// source by tests/services/kafka_cluster.py (KafkaCluster.controller):
//   java -cp '<kafka lib>/*' KafkaQuorum.java <bootstrap servers>
// Prints one line: the leader's node id, its epoch and the voters' ids, tab-separated.
import java.util.Properties;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.QuorumInfo;

public class KafkaQuorum {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("request.timeout.ms", "10000");
        props.put("default.api.timeout.ms", "20000");
        try (Admin admin = Admin.create(props)) {
            QuorumInfo quorum = admin.describeMetadataQuorum().quorumInfo().get();
            String voters = quorum.voters().stream()
                .map(v -> Integer.toString(v.replicaId()))
                .sorted()
                .collect(Collectors.joining(","));
            System.out.println(String.join("\t",
                Integer.toString(quorum.leaderId()),
                Long.toString(quorum.leaderEpoch()),
                voters));
        }
    }
}
